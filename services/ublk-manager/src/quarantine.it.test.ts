/**
 * Integration test of the device table's quarantine (issue 11): the real daemon (dist/main.js,
 * loop driver) started on a state dir whose table has a row this version cannot read next to a
 * good one starts, serves the good row, answers NOT_FOUND for the bad one and leaves the bad
 * row's image and loop device alone. Needs root, /dev/loop-control, e2fsprogs, util-linux and
 * the build (DAEMON_PARTS). Every loop device and file made here is removed in afterAll.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { DeviceServiceDefinition, DeviceState, Filesystem } from '@sandnode/shared/proto/ublk/v1/ublk';
import { describeWith, expectCode } from '@sandnode/testkit';
import { buildDaemon, cleanUpUnder, DAEMON_PARTS, loopsUnder, MIB, spawnDaemon, tempRoot, waitForLog, type Daemon } from './__tests__/handover-harness';
import { deviceDbPath, SqliteDeviceStore } from './store/sqlite-device-store';

jest.setTimeout(120_000);

describeWith('ublk-manager daemon on a device table with a bad row', DAEMON_PARTS, () => {
  let tmp: string;
  let daemon: Daemon | undefined;
  let channel: ReturnType<typeof createSandnodeChannel> | undefined;

  beforeAll(() => {
    buildDaemon();
    tmp = tempRoot('ublk-quarantine-it');
  });

  afterAll(async () => {
    if (!tmp) return;
    if (daemon && !daemon.exit) {
      daemon.proc.kill('SIGKILL');
      await daemon.done;
    }
    channel?.close();
    cleanUpUnder(tmp);
  });

  it('starts, serves the good row, answers NOT_FOUND for the quarantined one and leaves its image and loop device alone', async () => {
    const stateDir = path.join(tmp, 'state');
    const imagesDir = path.join(stateDir, 'images');
    const runDir = path.join(tmp, 'run');
    const logFile = path.join(tmp, 'daemon.log');
    mkdirSync(imagesDir, { recursive: true });
    const good = path.join(imagesDir, 'good.img');
    const newer = path.join(imagesDir, 'newer.img');
    for (const f of [good, newer]) execFileSync('truncate', ['-s', `${8 * MIB}`, f]);
    // The bad row's image is attached (a newer release's device in use).
    const newerLoop = execFileSync('losetup', ['--find', '--show', newer], { encoding: 'utf8' }).trim();

    const file = deviceDbPath(stateDir);
    const s = new SqliteDeviceStore(file);
    s.insert({
      deviceId: 'good',
      state: 'ready',
      sizeBytes: 8 * MIB,
      sourceImage: '',
      filesystem: 'none',
      readOnly: false,
      backingFile: good,
      path: '',
      createdAtMs: 1,
      updatedAtMs: 1,
      handoverToken: '',
      clonedFrom: '',
    });
    s.close();
    const db = new Database(file);
    db.prepare(
      `INSERT INTO devices (device_id, state, size_bytes, source_image, filesystem, read_only, backing_file, path, created_at_ms, updated_at_ms)
       VALUES ('newer', 'migrating', ?, '', 'ext4', 0, ?, ?, 1, 1)`,
    ).run(8 * MIB, newer, newerLoop);
    db.close();

    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SANDNODE_UBLK_MANAGER_')) env[k] = v;
    Object.assign(env, { SANDNODE_UBLK_MANAGER_STATE_DIR: stateDir, SANDNODE_UBLK_MANAGER_RUN_DIR: runDir, SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'debug' });
    daemon = spawnDaemon(logFile, env);
    await waitForLog(logFile, daemon, '"msg":"serving"');
    channel = createSandnodeChannel(`unix://${path.join(runDir, 'ublk-manager.sock')}`);
    const client = createServiceClient(DeviceServiceDefinition, channel, { timeoutMs: 30_000 });

    const { devices } = await client.listDevices({});
    expect(devices.map((d) => d.deviceId)).toEqual(['good']);
    expect(devices[0]).toMatchObject({ state: DeviceState.DEVICE_STATE_ATTACHED, filesystem: Filesystem.FILESYSTEM_NONE });
    await expectCode(client.getDevice({ deviceId: 'newer' }), Status.NOT_FOUND);
    await expectCode(client.createDevice({ deviceId: 'newer', sizeBytes: 8 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: false }), Status.FAILED_PRECONDITION);

    const log = readFileSync(logFile, 'utf8');
    expect(log).toMatch(/"device_id":"newer","reason":"unknown state \\"migrating\\"".*quarantined/);
    expect(log).toMatch(/quarantined row; not ours to judge, left alone/);
    // Not swept: the image is there and still attached where it was.
    expect(existsSync(newer)).toBe(true);
    expect(loopsUnder(tmp).get(newerLoop)).toBe(newer);
    const raw = new Database(file, { readonly: true });
    expect(raw.prepare('SELECT device_id, reason FROM quarantine').all()).toEqual([{ device_id: 'newer', reason: 'unknown state "migrating"' }]);
    raw.close();

    daemon.proc.kill('SIGTERM');
    await daemon.done;
  });
});
