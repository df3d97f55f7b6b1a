import { writeFileSync } from 'node:fs';
import { useTempDir } from '@sandnode/testkit';
import { driftWarning, runningDrift, settingsDrift } from './settings-drift';

describe('settingsDrift', () => {
  const running = { version: 1, listen: '127.0.0.1:7070', socketGroup: 'sandnode', drainDeadlineMs: 5000 };

  it('a --listen other than the running one, and SANDNODE_SERVER_* values other than its settings', () => {
    expect(settingsDrift(running, '0.0.0.0:7443', { SANDNODE_SERVER_SOCKET_GROUP: 'ops', SANDNODE_SERVER_DRAIN_DEADLINE_MS: '5000', PATH: '/bin' })).toEqual([
      { what: '--listen', asked: '0.0.0.0:7443', running: '127.0.0.1:7070' },
      { what: 'SANDNODE_SERVER_SOCKET_GROUP', asked: 'ops', running: 'sandnode' },
    ]);
  });

  it('nothing when they match, when --listen was not given, or for the per-process variables', () => {
    expect(settingsDrift(running, '127.0.0.1:7070', { SANDNODE_SERVER_SOCKET_GROUP: 'sandnode' })).toEqual([]);
    expect(settingsDrift(running, undefined, { SANDNODE_SERVER_STATE_DIR: '/x', SANDNODE_SERVER_RUN_DIR: '/y', SANDNODE_SERVER_FAILPOINTS: 'a', SANDNODE_SERVER_LISTEN: ':1' })).toEqual([]);
  });

  it('a key the file does not have runs with its default', () => {
    expect(settingsDrift({ version: 1 }, '0.0.0.0:1', { SANDNODE_SERVER_METRICS_LISTEN: '127.0.0.1:9' })).toEqual([
      { what: '--listen', asked: '0.0.0.0:1', running: '' },
      { what: 'SANDNODE_SERVER_METRICS_LISTEN', asked: '127.0.0.1:9', running: '' },
    ]);
  });

  it('the warning says the running node keeps its settings and how to apply new ones', () => {
    expect(driftWarning([])).toBe('');
    const w = driftWarning([{ what: '--listen', asked: '0.0.0.0:7443', running: '' }]);
    expect(w).toContain('sandnode: warning: the server runs already and keeps its settings; not applied:\n');
    expect(w).toContain('--listen=0.0.0.0:7443 (the running server has (none / default))');
    expect(w).toContain('sandnode down && sandnode up');
    expect(w.endsWith('\n')).toBe(true);
  });
});

describe('runningDrift', () => {
  const dir = useTempDir('cli-drift');

  it('reads <runDir>/server-settings.json; none (a build before 0.3.0) or a bad one: no drift known', () => {
    expect(runningDrift(dir(), '0.0.0.0:1', {})).toEqual([]);
    writeFileSync(`${dir()}/server-settings.json`, '{not json');
    expect(runningDrift(dir(), '0.0.0.0:1', {})).toEqual([]);
    writeFileSync(`${dir()}/server-settings.json`, JSON.stringify({ version: 1, listen: '' }));
    expect(runningDrift(dir(), '0.0.0.0:1', {})).toEqual([{ what: '--listen', asked: '0.0.0.0:1', running: '' }]);
  });
});
