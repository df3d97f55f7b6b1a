/**
 * The node's recorded settings (node-settings.ts): what `up` was given is what a later bare
 * `up`, a supervisor restart or a ublk-manager upgrade starts the daemons with (newcomer
 * finding: a supervisor restarted without the env came up on the default pool, network off).
 */
import { mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { isNodeSetting, nodeSettings, nodeSettingsFile, readNodeSettings, recordedNote } from './node-settings';

describe('node settings record', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-node-settings-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const given = {
    PATH: '/usr/bin',
    SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: '10.213.0.0/24',
    SANDNODE_VMM_SUPERVISOR_DNS_PORT: '15253',
    SANDNODE_UBLK_MANAGER_METRICS_LISTEN: '127.0.0.1:9486',
    SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:8483',
    SANDNODE_SERVER_STATE_DIR: '/elsewhere',
    SANDNODE_UBLK_MANAGER_SLOT: 'b',
    SANDNODE_SERVER_FAILPOINTS: 'x',
    SANDNODE_LISTEN: '127.0.0.1:7070',
  };
  const kept = {
    SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:8483',
    SANDNODE_UBLK_MANAGER_METRICS_LISTEN: '127.0.0.1:9486',
    SANDNODE_VMM_SUPERVISOR_DNS_PORT: '15253',
    SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: '10.213.0.0/24',
  };

  it("records the caller's daemon settings (no per-process ones) and gives them to a caller that has none", () => {
    expect(nodeSettings(dir, given, { record: true })).toEqual({ env: kept, source: 'caller', file: nodeSettingsFile(dir) });
    expect(statSync(nodeSettingsFile(dir)).mode & 0o777).toBe(0o600);
    const later = nodeSettings(dir, { PATH: '/usr/bin' });
    expect(later).toEqual({ env: kept, source: 'recorded', file: nodeSettingsFile(dir) });
    expect(recordedNote(later)).toContain('SANDNODE_VMM_SUPERVISOR_NETWORK_POOL=10.213.0.0/24');
  });

  it('a caller with any setting replaces the whole record; without record: true nothing is written', () => {
    nodeSettings(dir, given, { record: true });
    nodeSettings(dir, { SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:9999' });
    expect(readNodeSettings(dir)).toEqual(kept);
    nodeSettings(dir, { SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:9999' }, { record: true });
    expect(readNodeSettings(dir)).toEqual({ SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:9999' });
    expect(recordedNote(nodeSettings(dir, { SANDNODE_SERVER_INGRESS_LISTEN: '1' }))).toBe('');
  });

  it('none given and none recorded: the defaults (nothing)', () => {
    expect(nodeSettings(dir, {})).toEqual({ env: {}, source: 'none', file: nodeSettingsFile(dir) });
  });

  it('refuses a record that is a symlink, not JSON, or names a variable that is not a daemon setting', () => {
    const f = nodeSettingsFile(dir);
    writeFileSync(path.join(dir, 'other.json'), JSON.stringify({ env: kept }));
    symlinkSync(path.join(dir, 'other.json'), f);
    expect(() => readNodeSettings(dir)).toThrow(/cannot be read/);
    rmSync(f);
    writeFileSync(f, '{');
    expect(() => readNodeSettings(dir)).toThrow(/not JSON/);
    writeFileSync(f, JSON.stringify({ env: { LD_PRELOAD: '/tmp/x.so' } }));
    expect(() => readNodeSettings(dir)).toThrow(/"LD_PRELOAD" is not a daemon config variable/);
    writeFileSync(f, JSON.stringify({ env: { SANDNODE_SERVER_CONFIG: '/tmp/planted.json' } }));
    expect(() => readNodeSettings(dir)).toThrow(/SANDNODE_SERVER_CONFIG/);
    writeFileSync(f, JSON.stringify({ env: { SANDNODE_SERVER_INGRESS_LISTEN: 7 } }));
    expect(() => readNodeSettings(dir)).toThrow(/string value/);
    expect(readFileSync(f, 'utf8')).toContain('7');
  });

  it('isNodeSetting: daemon config keys only', () => {
    expect(isNodeSetting('SANDNODE_VMM_SUPERVISOR_EGRESS_PROXY_PORT')).toBe(true);
    expect(isNodeSetting('SANDNODE_SERVER_RUN_DIR')).toBe(false);
    expect(isNodeSetting('SANDNODE_SERVER_TAKEOVER')).toBe(false);
    expect(isNodeSetting('SANDNODE_START_TIMEOUT_MS')).toBe(false);
    expect(isNodeSetting('SANDNODE_SERVER_')).toBe(false);
  });
});
