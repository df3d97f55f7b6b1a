import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { loadConfig, type ConfigNote } from '@sandnode/shared';
import { configSchema, loadServerConfig, SERVICE, V1_KEYS } from '../config';
import { nodeSettings } from '../main';
import { settingsFile, writeSettingsFile } from './settings-file';

describe('settings file', () => {
  const tmp = useTempDir('settings-file-');

  it('holds the keys given that differ from the defaults, the dirs absolute, no per-process key, and loads back as the same config', () => {
    const env = { SANDNODE_SERVER_METRICS_LISTEN: '127.0.0.1:19464', SANDNODE_SERVER_DRAIN_MS: '5000', SANDNODE_SERVER_SLOT: 'b', SANDNODE_SERVER_TAKEOVER: 'true', SANDNODE_SERVER_RUN_DIR: tmp() };
    const cfg = loadServerConfig({ env });
    writeSettingsFile(cfg.runDir, nodeSettings(loadConfig(configSchema, { service: SERVICE, env }), cfg));
    const file = settingsFile(cfg.runDir);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    // drainMs 5000 is the default: not written; slot and takeover belong to one process
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual({ version: 1, metricsListen: '127.0.0.1:19464', stateDir: cfg.stateDir, runDir: cfg.runDir });
    const again = loadServerConfig({ file, env: {} });
    expect({ ...again, slot: cfg.slot, takeover: cfg.takeover }).toEqual(cfg);
  });

  it('keeps the keys 0.2.0 does not know out of the v1 slot and in the v2 slot, which this build reads', () => {
    const env = { SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:18480', SANDNODE_SERVER_DRAIN_DEADLINE_MS: '9000', SANDNODE_SERVER_RUN_DIR: tmp() };
    const cfg = loadServerConfig({ env });
    const written = writeSettingsFile(cfg.runDir, nodeSettings(loadConfig(configSchema, { service: SERVICE, env }), cfg));
    const file = settingsFile(cfg.runDir);
    expect(written).toEqual([path.join(cfg.runDir, 'server-settings.v2.json'), file]);
    const v1 = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
    expect(v1).toEqual({ version: 1, drainDeadlineMs: 9000, stateDir: cfg.stateDir, runDir: cfg.runDir });
    for (const k of Object.keys(v1)) if (k !== 'version') expect(V1_KEYS).toContain(k);
    expect(JSON.parse(readFileSync(written[0]!, 'utf8'))).toEqual({ version: 2, ingressListen: '127.0.0.1:18480', drainDeadlineMs: 9000, stateDir: cfg.stateDir, runDir: cfg.runDir });
    const notes: ConfigNote[] = [];
    expect(loadServerConfig({ file, env: {}, notes }).ingressListen).toBe('127.0.0.1:18480');
    expect(notes).toEqual([]);
  });
});
