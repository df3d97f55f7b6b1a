import { rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '@sandnode/shared';
import { makeTempDir } from '@sandnode/testkit';
import { loadUblkConfig } from './config';
import type { ConfigNote } from '@sandnode/shared';
import { parseArgs, UsageError } from './main';

describe('loadUblkConfig', () => {
  it('takes a unix socket listen address only: a TCP one is refused naming the key (no TCP authentication)', () => {
    for (const listen of ['127.0.0.1:7072', '0.0.0.0:7072']) {
      expect(() => loadUblkConfig({ env: { SANDNODE_UBLK_MANAGER_LISTEN: listen } })).toThrow(ConfigError);
      expect(() => loadUblkConfig({ env: { SANDNODE_UBLK_MANAGER_LISTEN: listen } })).toThrow(/listen.*unix socket/);
    }
  });

  it('resolves defaults from stateDir and runDir', () => {
    const c = loadUblkConfig({ env: { SANDNODE_UBLK_MANAGER_STATE_DIR: '/s', SANDNODE_UBLK_MANAGER_RUN_DIR: '/r' } });
    expect(c).toEqual({
      slot: '',
      metricsListen: '127.0.0.1:9466',
      ublkServer: 'ublk',
      stateDir: '/s',
      runDir: '/r',
      listen: 'unix:///r/ublk-manager.sock',
      logLevel: 'info',
      driver: 'loop',
      imagesDir: '/s/images',
      maxDeviceSizeBytes: 1024 ** 4,
      directIo: true,
      drainMs: 5000,
      slotLockWaitMs: 2000,
      releaseTimeoutMs: 30_000,
      cloneTimeoutMs: 600_000,
      mkfsTimeoutMs: 120_000,
      imagePool: true,
      imagePoolInitialBytes: 16 * 1024 ** 3,
      imagePoolMaxBytes: 512 * 1024 ** 3,
      imagePoolMinFreeBytes: 4 * 1024 ** 3,
      imagePoolHostMinFreeBytes: 1024 ** 3,
      imagePoolCheckMs: 10_000,
      emptyImageTemplates: true,
    });
  });

  it('turns the image pool off and sizes it from env; refuses a pool below 512 MiB naming the key', () => {
    const env = { SANDNODE_UBLK_MANAGER_IMAGE_POOL: 'false', SANDNODE_UBLK_MANAGER_IMAGE_POOL_MAX_BYTES: String(2 * 1024 ** 3), SANDNODE_UBLK_MANAGER_EMPTY_IMAGE_TEMPLATES: 'off' };
    expect(loadUblkConfig({ env })).toMatchObject({ imagePool: false, imagePoolMaxBytes: 2 * 1024 ** 3, emptyImageTemplates: false });
    expect(() => loadUblkConfig({ env: { SANDNODE_UBLK_MANAGER_IMAGE_POOL_INITIAL_BYTES: String(100 * 1024 ** 2) } })).toThrow(/imagePoolInitialBytes/);
  });

  it('gives slot a and b their own socket; validates slot and metricsListen', () => {
    const env = { SANDNODE_UBLK_MANAGER_STATE_DIR: '/s', SANDNODE_UBLK_MANAGER_RUN_DIR: '/r' };
    expect(loadUblkConfig({ env: { ...env, SANDNODE_UBLK_MANAGER_SLOT: 'a' } }).listen).toBe('unix:///r/ublk-manager-a.sock');
    expect(loadUblkConfig({ env: { ...env, SANDNODE_UBLK_MANAGER_SLOT: 'b' } }).listen).toBe('unix:///r/ublk-manager-b.sock');
    expect(() => loadUblkConfig({ env: { ...env, SANDNODE_UBLK_MANAGER_SLOT: 'c' } })).toThrow(/slot/);
    expect(loadUblkConfig({ env: { ...env, SANDNODE_UBLK_MANAGER_METRICS_LISTEN: '127.0.0.1:9464' } }).metricsListen).toBe('127.0.0.1:9464');
    expect(() => loadUblkConfig({ env: { ...env, SANDNODE_UBLK_MANAGER_METRICS_LISTEN: 'nope' } })).toThrow(/metricsListen/);
  });

  it('reads env strings for numbers and booleans', () => {
    const c = loadUblkConfig({ env: { SANDNODE_UBLK_MANAGER_DIRECT_IO: 'false', SANDNODE_UBLK_MANAGER_MAX_DEVICE_SIZE_BYTES: '268435456', SANDNODE_UBLK_MANAGER_DRIVER: 'ublk' } });
    expect(c).toMatchObject({ directIo: false, maxDeviceSizeBytes: 256 * 1024 * 1024, driver: 'ublk' });
  });

  it('reads a JSON file with version 1, env overriding it', () => {
    const dir = makeTempDir('ublk-cfg');
    try {
      const file = path.join(dir, 'c.json');
      writeFileSync(file, JSON.stringify({ version: 1, imagesDir: '/img', directIo: false, logLevel: 'debug' }));
      expect(loadUblkConfig({ file, env: { SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'warn' } })).toMatchObject({ imagesDir: '/img', directIo: false, logLevel: 'warn' });
      // a key this build does not know (a typo, a newer build's) is noted and ignored; listed in required it stops the start
      writeFileSync(file, JSON.stringify({ version: 1, imagesdir: '/img' }));
      const notes: ConfigNote[] = [];
      expect(loadUblkConfig({ file, env: {}, notes }).imagesDir).not.toBe('/img');
      expect(notes.map((n) => n.keys)).toEqual([['imagesdir']]);
      writeFileSync(file, JSON.stringify({ version: 2, required: ['imagesdir'], imagesdir: '/img' }));
      expect(() => loadUblkConfig({ file, env: {} })).toThrow(/does not know: imagesdir/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it.each([
    ['driver', 'SANDNODE_UBLK_MANAGER_DRIVER', 'nbd'],
    ['maxDeviceSizeBytes', 'SANDNODE_UBLK_MANAGER_MAX_DEVICE_SIZE_BYTES', '1000'],
    ['maxDeviceSizeBytes', 'SANDNODE_UBLK_MANAGER_MAX_DEVICE_SIZE_BYTES', '2097153'],
    ['directIo', 'SANDNODE_UBLK_MANAGER_DIRECT_IO', 'maybe'],
    ['logLevel', 'SANDNODE_UBLK_MANAGER_LOG_LEVEL', 'loud'],
    ['directIo', 'SANDNODE_UBLK_MANAGER_DIRECT_IO', 'ture'],
    ['releaseTimeoutMs', 'SANDNODE_UBLK_MANAGER_RELEASE_TIMEOUT_MS', '10'],
    ['slotLockWaitMs', 'SANDNODE_UBLK_MANAGER_SLOT_LOCK_WAIT_MS', '-1'],
    ['cloneTimeoutMs', 'SANDNODE_UBLK_MANAGER_CLONE_TIMEOUT_MS', 'soon'],
  ])('names the bad key %s', (key, env, value) => {
    let err: unknown;
    try {
      loadUblkConfig({ env: { [env]: value } });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message).toContain(`"${key}"`);
  });
});

describe('parseArgs', () => {
  it('accepts --config FILE, --config=FILE and --help', () => {
    expect(parseArgs(['--config', '/c.json'])).toEqual({ config: '/c.json', help: false });
    expect(parseArgs(['--config=/c.json'])).toEqual({ config: '/c.json', help: false });
    expect(parseArgs(['--help'])).toEqual({ help: true });
    expect(parseArgs([])).toEqual({ help: false });
  });

  it.each([
    [['--config'], /^--config needs a value \(usage: /],
    [['--config='], /^--config needs a value \(usage: /],
    [['--config', '--help'], /^--config needs a value \(got "--help"\)/],
    [['--bogus'], /^unknown argument "--bogus" \(usage: sandnode-ublk-manager \[--config FILE\]\)$/],
    [['--config', '/c.json', 'extra'], /^unknown argument "extra"/],
  ])('%j is a UsageError naming it', (argv, message) => {
    let err: unknown;
    try {
      parseArgs(argv);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).toMatch(message);
  });
});
