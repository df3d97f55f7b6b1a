/** The standby's environment: the node's settings file as its config, or, for a build before 0.3.0 (a rollback), as variables of the keys it knows. */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { SERVER_SETTINGS_FILE, standbyEnv } from './upgrade';

describe('standbyEnv', () => {
  const tmp = useTempDir('sandnode-standby-env-');
  const node = () => {
    const root = tmp();
    const dirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
    mkdirSync(dirs.runDir, { recursive: true });
    writeFileSync(path.join(dirs.runDir, SERVER_SETTINGS_FILE), JSON.stringify({ version: 1, ingressListen: '127.0.0.1:16400', drainMs: 7000, stateDir: dirs.stateDir, runDir: dirs.runDir }));
    return { root, dirs };
  };
  const caller = { PATH: '/bin', SANDNODE_SERVER_INGRESS_LISTEN: '0.0.0.0:1', SANDNODE_SERVER_FAILPOINTS: 'x=exit' };

  it('a 0.3.0 build gets the settings file as its config, without the caller server variables', () => {
    const { root, dirs } = node();
    const build = path.join(root, 'n');
    mkdirSync(path.join(build, 'services', 'server', 'dist', 'handover'), { recursive: true });
    writeFileSync(path.join(build, 'services', 'server', 'dist', 'handover', 'settings-file.js'), '');
    const env = standbyEnv(dirs, caller, 'b', build);
    expect(env.SANDNODE_SERVER_CONFIG).toBe(path.join(path.resolve(dirs.runDir), SERVER_SETTINGS_FILE));
    expect(env.SANDNODE_SERVER_INGRESS_LISTEN).toBeUndefined();
    expect(env.SANDNODE_SERVER_FAILPOINTS).toBe('x=exit');
  });

  it('a build before 0.3.0 gets the v1 slot of a settings file with slots as its config (the keys it knows)', () => {
    const { root, dirs } = node();
    writeFileSync(path.join(dirs.runDir, 'server-settings.v2.json'), JSON.stringify({ version: 2, ingressListen: '127.0.0.1:16400', drainMs: 7000 }));
    const build = path.join(root, 'old');
    mkdirSync(path.join(build, 'services', 'server', 'dist', 'handover'), { recursive: true });
    const env = standbyEnv(dirs, caller, 'a', build);
    expect(env.SANDNODE_SERVER_CONFIG).toBe(path.join(path.resolve(dirs.runDir), SERVER_SETTINGS_FILE));
    expect(env.SANDNODE_SERVER_INGRESS_LISTEN).toBeUndefined();
    expect(env.SANDNODE_SERVER_SLOT).toBe('a');
  });

  it('a build before 0.3.0 (no settings file of its own) gets the settings of a file without slots as variables, not a config file with keys it would refuse', () => {
    const { root, dirs } = node();
    const build = path.join(root, 'old');
    mkdirSync(path.join(build, 'services', 'server', 'dist', 'handover'), { recursive: true });
    const env = standbyEnv(dirs, caller, 'a', build);
    expect(env.SANDNODE_SERVER_CONFIG).toBeUndefined();
    expect(env.SANDNODE_SERVER_INGRESS_LISTEN).toBe('127.0.0.1:16400');
    expect(env.SANDNODE_SERVER_DRAIN_MS).toBe('7000');
    expect(env.SANDNODE_SERVER_SLOT).toBe('a');
    expect(env.SANDNODE_SERVER_TAKEOVER).toBe('true');
    expect(env.SANDNODE_SERVER_VERSION).toBeUndefined();
  });
});
