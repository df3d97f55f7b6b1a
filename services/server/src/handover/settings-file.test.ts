import { readFileSync, statSync } from 'node:fs';
import { useTempDir } from '@sandnode/testkit';
import { loadConfig } from '@sandnode/shared';
import { configSchema, loadServerConfig, SERVICE } from '../config';
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
});
