/**
 * Integration tests of CloneDevice with the loop driver: the real daemon (dist/main.js) on a
 * unix socket in a temp dir, real loop devices, ext4, mount, fsfreeze, e2fsck, debugfs, and
 * crashes by failpoint (SIGKILL). Needs root, /dev/loop-control, e2fsprogs, util-linux,
 * fsfreeze and the build: skips naming what is missing, fails instead under CI=true (testkit
 * describeWith). Every loop device, mount, image and process made here is removed in
 * afterAll (a leftover mount or loop device fails the suite); nothing else is touched.
 */
import { spawnSync, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { ClientError, Metadata, Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { DeviceServiceDefinition, DeviceState, Filesystem, type CloneDeviceRequest, type Device } from '@sandnode/shared/proto/ublk/v1/ublk';
import { describeWith, expectCode, PARTS } from '@sandnode/testkit';
import { lockSlot } from './store/locks';
import {
  imageFiles,
  backingOf,
  buildDaemon,
  cleanUpUnder,
  DAEMON_PARTS,
  httpGet,
  loopsUnder,
  MIB,
  mountsUnder,
  spawnDaemon,
  tempRoot,
  waitForLog,
  type Daemon,
  type Exit,
} from './__tests__/handover-harness';

const GIB = 1024 * MIB;
const MAX = 2 * GIB;

jest.setTimeout(180_000);

function allocated(file: string): number {
  return statSync(file).blocks * 512;
}

/** debugfsCat reads a file of an (unmounted or read-only) ext4 image or device. */
function debugfsCat(image: string, file: string): string {
  return spawnSync('debugfs', ['-R', `cat ${file}`, image], { encoding: 'utf8', maxBuffer: 64 * MIB }).stdout;
}

describeWith('ublk-manager CloneDevice (loop driver, real daemon)', [...DAEMON_PARTS, PARTS.fsfreeze], () => {
  let tmp: string;
  let stateDir: string;
  let runDir: string;
  let imagesDir: string;
  let logFile: string;
  let addr: string;
  let daemon: Daemon | undefined;
  let channel: ReturnType<typeof createSandnodeChannel> | undefined;
  let client: ReturnType<typeof createServiceClient<typeof DeviceServiceDefinition>>;
  let version: ReturnType<typeof createServiceClient<typeof VersionServiceDefinition>>;
  const metricsPort = 20000 + ((process.pid + 7919) % 20000);
  let parent: Device;
  let parentMnt: string;
  let childMnt: string;

  function env(extra: Record<string, string>): NodeJS.ProcessEnv {
    const e: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SANDNODE_')) e[k] = v;
    return {
      ...e,
      SANDNODE_UBLK_MANAGER_STATE_DIR: stateDir,
      SANDNODE_UBLK_MANAGER_RUN_DIR: runDir,
      SANDNODE_UBLK_MANAGER_MAX_DEVICE_SIZE_BYTES: String(MAX),
      SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'debug',
      SANDNODE_UBLK_MANAGER_METRICS_LISTEN: `127.0.0.1:${metricsPort}`,
      ...extra,
    };
  }

  /** startDaemon spawns dist/main.js (log appended to logFile), waits for "serving", connects. */
  async function startDaemon(extra: Record<string, string> = {}): Promise<number> {
    daemon = spawnDaemon(logFile, env(extra));
    await waitForLog(logFile, daemon, '"msg":"serving"');
    channel?.close();
    channel = createSandnodeChannel(addr);
    client = createServiceClient(DeviceServiceDefinition, channel, { timeoutMs: 120_000 });
    version = createServiceClient(VersionServiceDefinition, channel, { timeoutMs: 5000 });
    return daemon.pid;
  }

  async function stopDaemon(signal: NodeJS.Signals): Promise<Exit> {
    if (!daemon) throw new Error('no daemon');
    daemon.proc.kill(signal);
    return waitExit();
  }

  async function waitExit(): Promise<Exit> {
    const r = await daemon!.done;
    daemon = undefined;
    return r;
  }

  function rows(): { device_id: string; state: string; cloned_from: string }[] {
    const db = new Database(path.join(stateDir, 'ublk-manager', 'default', 'devices.db'), { readonly: true });
    try {
      return db.prepare('SELECT device_id, state, cloned_from FROM devices ORDER BY device_id').all() as { device_id: string; state: string; cloned_from: string }[];
    } finally {
      db.close();
    }
  }

  /** snapshot is everything a refused call must leave as it was. */
  async function snapshot(): Promise<unknown> {
    return { devices: (await client.listDevices({})).devices, images: imageFiles(imagesDir), rows: rows() };
  }

  const req = (over: Partial<CloneDeviceRequest> = {}): CloneDeviceRequest => ({
    deviceId: 'child',
    sourceDeviceId: 'parent',
    sourceQuiesced: true,
    readOnly: false,
    ...over,
  });

  /** frozen runs fn with the filesystem mounted at mnt frozen (FIFREEZE, like podd Quiesce). */
  async function frozen<T>(mnt: string, fn: () => Promise<T>): Promise<T> {
    execFileSync('fsfreeze', ['--freeze', mnt]);
    try {
      return await fn();
    } finally {
      execFileSync('fsfreeze', ['--unfreeze', mnt]);
    }
  }

  beforeAll(async () => {
    buildDaemon();
    tmp = tempRoot('ublk-clone-it');
    stateDir = path.join(tmp, 'state');
    runDir = path.join(tmp, 'run');
    imagesDir = path.join(stateDir, 'images');
    logFile = path.join(tmp, 'daemon.log');
    parentMnt = path.join(tmp, 'mnt-parent');
    childMnt = path.join(tmp, 'mnt-child');
    mkdirSync(parentMnt);
    mkdirSync(childMnt);
    addr = `unix://${path.join(runDir, 'ublk-manager.sock')}`;
    await startDaemon();
  }, 120_000);

  afterAll(async () => {
    if (!tmp) return;
    if (daemon) {
      daemon.proc.kill('SIGKILL');
      await daemon.done;
    }
    channel?.close();
    cleanUpUnder(tmp);
  });

  it('GetVersion lists the feature "ublk.clone"', async () => {
    expect((await version.getVersion({})).features).toContain('ublk.clone');
  });

  it('clones a mounted, frozen source with data: same size, filesystem and content, e2fsck clean, holes stay holes, cloned_from persisted', async () => {
    parent = (await client.createDevice({ deviceId: 'parent', sizeBytes: 256 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    execFileSync('mount', [parent.path, parentMnt]);
    execFileSync('dd', ['if=/dev/urandom', `of=${path.join(parentMnt, 'data.bin')}`, 'bs=1M', 'count=8', 'status=none']);
    execFileSync('sh', ['-c', `echo hello-from-parent > ${path.join(parentMnt, 'hello.txt')}`]);
    execFileSync('sync', ['-f', parentMnt]);

    const { res, srcAllocated } = await frozen(parentMnt, async () => {
      const r = await client.cloneDevice(req());
      return { res: r, srcAllocated: allocated(parent.backingFile) };
    });
    const d = res.device!;
    expect(d).toMatchObject({
      deviceId: 'child',
      clonedFrom: 'parent',
      sizeBytes: 256 * MIB,
      filesystem: Filesystem.FILESYSTEM_EXT4,
      state: DeviceState.DEVICE_STATE_ATTACHED,
      readOnly: false,
      driver: 'loop',
      backingFile: path.join(imagesDir, 'child.img'),
    });
    expect(backingOf(d.path)).toBe(d.backingFile);
    expect(res.cloneMs).toBeGreaterThanOrEqual(1);
    expect(res.copiedBytes).toBe(srcAllocated);
    // reflinked is true only where the images dir's file system has FICLONE.
    const probe = spawnSync('cp', ['--reflink=always', parent.backingFile, path.join(imagesDir, '.probe.img')]);
    rmSync(path.join(imagesDir, '.probe.img'), { force: true });
    expect(res.reflinked).toBe(probe.status === 0);

    expect(spawnSync('e2fsck', ['-fn', d.backingFile]).status).toBe(0);
    const cloneAllocated = allocated(d.backingFile);
    expect(cloneAllocated).toBeLessThanOrEqual(srcAllocated + MIB);
    expect(cloneAllocated).toBeGreaterThan(8 * MIB);
    expect(cloneAllocated).toBeLessThan(d.sizeBytes / 4);

    execFileSync('mount', ['-o', 'ro', d.path, childMnt]);
    expect(readFileSync(path.join(childMnt, 'hello.txt'), 'utf8')).toBe('hello-from-parent\n');
    expect(readFileSync(path.join(childMnt, 'data.bin')).equals(readFileSync(path.join(parentMnt, 'data.bin')))).toBe(true);
    execFileSync('umount', [childMnt]);

    expect(rows().find((r) => r.device_id === 'child')).toEqual({ device_id: 'child', state: 'ready', cloned_from: 'parent' });
    expect((await client.getDevice({ deviceId: 'child' })).device).toEqual(d);
    expect(imageFiles(imagesDir)).toEqual(['child.img', 'parent.img']);
  });

  it('isolation: a write to the source after the clone is not in the clone, and a write to the clone is not in the source', async () => {
    const c = (await client.getDevice({ deviceId: 'child' })).device!;
    execFileSync('sh', ['-c', `echo after > ${path.join(parentMnt, 'after.txt')} && echo changed > ${path.join(parentMnt, 'hello.txt')}`]);
    execFileSync('sync', ['-f', parentMnt]);
    execFileSync('mount', [c.path, childMnt]);
    try {
      expect(existsSync(path.join(childMnt, 'after.txt'))).toBe(false);
      expect(readFileSync(path.join(childMnt, 'hello.txt'), 'utf8')).toBe('hello-from-parent\n');
      execFileSync('sh', ['-c', `echo child-only > ${path.join(childMnt, 'child.txt')}`]);
      execFileSync('sync', ['-f', childMnt]);
    } finally {
      execFileSync('umount', [childMnt]);
    }
    expect(existsSync(path.join(parentMnt, 'child.txt'))).toBe(false);
    expect(readFileSync(path.join(parentMnt, 'hello.txt'), 'utf8')).toBe('changed\n');
    expect(debugfsCat(c.path, 'child.txt')).toBe('child-only\n');
  });

  it('is idempotent: a retry returns the existing clone (clone_ms 0), copies nothing', async () => {
    const before = await snapshot();
    const d = (await client.getDevice({ deviceId: 'child' })).device!;
    const again = await client.cloneDevice(req());
    expect(again).toMatchObject({ cloneMs: 0, copiedBytes: 0 });
    expect(again.device).toEqual(d);
    expect(debugfsCat(d.path, 'child.txt')).toBe('child-only\n'); // not overwritten by a new copy
    expect(await snapshot()).toEqual(before);
  });

  it('refuses with the promised codes and changes nothing', async () => {
    await client.createDevice({ deviceId: 'other', sizeBytes: 4 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: false });
    const before = await snapshot();
    const IA = Status.INVALID_ARGUMENT;
    await expectCode(client.cloneDevice(req({ deviceId: 'Bad_Id' })), IA, 'device_id');
    await expectCode(client.cloneDevice(req({ deviceId: '' })), IA, 'device_id');
    await expectCode(client.cloneDevice(req({ deviceId: 'k1', sourceDeviceId: '../x' })), IA, 'source_device_id');
    await expectCode(client.cloneDevice(req({ deviceId: 'parent' })), IA, 'source_device_id');
    await expectCode(client.cloneDevice(req({ deviceId: 'k1', sourceDeviceId: 'nope' })), Status.NOT_FOUND, 'nope');
    // The source is mounted read-write and the caller did not say it is frozen.
    await expectCode(client.cloneDevice(req({ deviceId: 'k1', sourceQuiesced: false })), Status.FAILED_PRECONDITION, 'read-write');
    // device_id exists and is not a clone of that source.
    await expectCode(client.cloneDevice(req({ deviceId: 'other' })), Status.ALREADY_EXISTS, 'other');
    await expectCode(client.cloneDevice(req({ sourceDeviceId: 'other' })), Status.ALREADY_EXISTS, 'a clone of "parent"');
    await expectCode(client.cloneDevice(req({ readOnly: true })), Status.ALREADY_EXISTS, 'read_only');
    // A retiring slot (HandoverAll of a running slot b listed this one): UNAVAILABLE.
    const bLock = lockSlot(path.join(stateDir, 'ublk-manager', 'b', 'lock'), 'test: slot b "running"');
    try {
      const md = Metadata({ 'sandnode-handover-to': 'b' });
      await client.listDevices({}, { metadata: md });
      await expectCode(client.cloneDevice(req({ deviceId: 'k1' })), Status.UNAVAILABLE, 'handing its devices');
    } finally {
      bLock.release();
    }
    // b is not running any more: the next call ends retiring and is served.
    expect(await snapshot()).toEqual(before);
    expect(mountsUnder(tmp).filter((m) => m !== imagesDir)).toEqual([parentMnt]);
  });

  it('clones a read-only or a detached source without source_quiesced', async () => {
    await client.createDevice({ deviceId: 'tpl', sizeBytes: 16 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: true });
    const ro = await client.cloneDevice(req({ deviceId: 'from-ro', sourceDeviceId: 'tpl', sourceQuiesced: false, readOnly: true }));
    expect(ro.device).toMatchObject({ clonedFrom: 'tpl', readOnly: true, state: DeviceState.DEVICE_STATE_ATTACHED, sizeBytes: 16 * MIB });
    expect(readFileSync(`/sys/block/${path.basename(ro.device!.path)}/ro`, 'utf8').trim()).toBe('1');
    expect(spawnSync('e2fsck', ['-fn', ro.device!.backingFile]).status).toBe(0);

    const det = (await client.createDevice({ deviceId: 'det', sizeBytes: 16 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    execFileSync('losetup', ['-d', det.path]);
    expect((await client.getDevice({ deviceId: 'det' })).device?.state).toBe(DeviceState.DEVICE_STATE_DETACHED);
    const fromDet = await client.cloneDevice(req({ deviceId: 'from-det', sourceDeviceId: 'det', sourceQuiesced: false }));
    expect(fromDet.device).toMatchObject({ clonedFrom: 'det', state: DeviceState.DEVICE_STATE_ATTACHED });
    expect(spawnSync('e2fsck', ['-fn', fromDet.device!.backingFile]).status).toBe(0);
    // The source stays as it was (detached).
    expect((await client.getDevice({ deviceId: 'det' })).device?.state).toBe(DeviceState.DEVICE_STATE_DETACHED);
  });

  it('SnapshotDevices (ublk.clone-snapshot.v1): clones of a frozen source persisted but not attached; CloneDevice attaches them after the thaw with the frozen data; one bad item undoes all', async () => {
    expect((await version.getVersion({})).features).toContain('ublk.clone-snapshot.v1');
    execFileSync('sh', ['-c', `echo at-freeze > ${path.join(parentMnt, 'snap.txt')}`]);
    execFileSync('sync', ['-f', parentMnt]);
    const before = await snapshot();
    await expectCode(
      frozen(parentMnt, () =>
        client.snapshotDevices({
          items: [
            { deviceId: 'snap-a', sourceDeviceId: 'parent' },
            { deviceId: 'snap-b', sourceDeviceId: 'nope' },
          ],
          sourceQuiesced: true,
        }),
      ),
      Status.NOT_FOUND,
      'nope',
    );
    await expectCode(client.snapshotDevices({ items: [], sourceQuiesced: true }), Status.INVALID_ARGUMENT, 'items');
    await expectCode(client.snapshotDevices({ items: [{ deviceId: 'snap-a', sourceDeviceId: 'parent' }], sourceQuiesced: false }), Status.FAILED_PRECONDITION, 'read-write');
    expect(await snapshot()).toEqual(before);

    const loopsBefore = loopsUnder(tmp).size;
    const r = await frozen(parentMnt, () => client.snapshotDevices({ items: [{ deviceId: 'snap-a', sourceDeviceId: 'parent' }], sourceQuiesced: true }));
    expect(r.snapshots).toHaveLength(1);
    expect(r.snapshots[0]!.device).toMatchObject({ deviceId: 'snap-a', clonedFrom: 'parent', state: DeviceState.DEVICE_STATE_DETACHED, path: '' });
    expect(loopsUnder(tmp).size).toBe(loopsBefore);
    expect(rows().find((x) => x.device_id === 'snap-a')).toEqual({ device_id: 'snap-a', state: 'ready', cloned_from: 'parent' });
    // written after the thaw: not in the snapshot
    execFileSync('sh', ['-c', `echo after-thaw > ${path.join(parentMnt, 'snap.txt')}`]);
    const att = await client.cloneDevice(req({ deviceId: 'snap-a', sourceQuiesced: false }));
    expect(att).toMatchObject({ cloneMs: 0, device: { state: DeviceState.DEVICE_STATE_ATTACHED, clonedFrom: 'parent' } });
    expect(spawnSync('e2fsck', ['-fn', att.device!.backingFile]).status).toBe(0);
    execFileSync('mount', ['-o', 'ro', att.device!.path, childMnt]);
    try {
      expect(readFileSync(path.join(childMnt, 'snap.txt'), 'utf8')).toBe('at-freeze\n');
    } finally {
      execFileSync('umount', [childMnt]);
    }
    await client.deleteDevice({ deviceId: 'snap-a' });
  });

  it('exports sandnode_ublk_clone_seconds on /metrics', async () => {
    const body = await httpGet(`http://127.0.0.1:${metricsPort}/metrics`);
    expect(body).toMatch(/sandnode_ublk_clone_seconds_count\{reflinked="(true|false)"\} [1-9]/);
  });

  it('crash after the copy, before the rename and the ready row (failpoint kill): restart leaves no temp, no image, no row; the retry clones', async () => {
    await stopDaemon('SIGTERM');
    await startDaemon({ SANDNODE_UBLK_MANAGER_FAILPOINTS: 'ublk.clone.after-copy=kill' });
    const call = client.cloneDevice(req({ deviceId: 'crash1' }));
    await expect(call).rejects.toBeInstanceOf(ClientError);
    expect((await waitExit()).signal).toBe('SIGKILL');
    // On disk: the fsynced copy under its temp name and the `creating` row.
    expect(readdirSync(imagesDir).filter((f) => f.startsWith('.crash1.img.clone-'))).toHaveLength(1);
    expect(existsSync(path.join(imagesDir, 'crash1.img'))).toBe(false);
    expect(rows().find((r) => r.device_id === 'crash1')).toMatchObject({ state: 'creating', cloned_from: 'parent' });

    await startDaemon();
    expect(readdirSync(imagesDir).filter((f) => f.includes('crash1'))).toEqual([]);
    expect(rows().find((r) => r.device_id === 'crash1')).toBeUndefined();
    await expectCode(client.getDevice({ deviceId: 'crash1' }), Status.NOT_FOUND);
    const again = await frozen(parentMnt, () => client.cloneDevice(req({ deviceId: 'crash1' })));
    expect(again.cloneMs).toBeGreaterThanOrEqual(1);
    expect(spawnSync('e2fsck', ['-fn', again.device!.backingFile]).status).toBe(0);
  });

  it('crash after the ready row, before the attach (failpoint kill): adoption attaches the clone; the retry returns it', async () => {
    await stopDaemon('SIGTERM');
    await startDaemon({ SANDNODE_UBLK_MANAGER_FAILPOINTS: 'ublk.clone.after-persist=kill' });
    await expect(frozen(parentMnt, () => client.cloneDevice(req({ deviceId: 'crash2' })))).rejects.toBeInstanceOf(ClientError);
    expect((await waitExit()).signal).toBe('SIGKILL');
    expect(rows().find((r) => r.device_id === 'crash2')).toEqual({ device_id: 'crash2', state: 'ready', cloned_from: 'parent' });
    const image = path.join(imagesDir, 'crash2.img');
    expect(existsSync(image)).toBe(true);
    expect([...loopsUnder(tmp).values()]).not.toContain(image);

    await startDaemon();
    const d = (await client.getDevice({ deviceId: 'crash2' })).device!;
    expect(d).toMatchObject({ state: DeviceState.DEVICE_STATE_ATTACHED, clonedFrom: 'parent' });
    expect(backingOf(d.path)).toBe(image);
    expect(spawnSync('e2fsck', ['-fn', image]).status).toBe(0);
    const retry = await client.cloneDevice(req({ deviceId: 'crash2' }));
    expect(retry).toMatchObject({ cloneMs: 0 });
    expect(retry.device?.path).toBe(d.path);
  });

  it('measures a clone of a 1 GiB sparse source with 100 MB written (noted, not asserted)', async () => {
    const big = (await client.createDevice({ deviceId: 'big', sizeBytes: GIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    const mnt = path.join(tmp, 'mnt-big');
    mkdirSync(mnt);
    execFileSync('mount', [big.path, mnt]);
    try {
      execFileSync('dd', ['if=/dev/urandom', `of=${path.join(mnt, 'blob')}`, 'bs=1M', 'count=100', 'status=none']);
      execFileSync('sync', ['-f', mnt]);
      let callMs = 0;
      const r = await frozen(mnt, async () => {
        const t0 = performance.now();
        const out = await client.cloneDevice(req({ deviceId: 'big-kid', sourceDeviceId: 'big' }));
        callMs = performance.now() - t0;
        return out;
      });
      const line = readFileSync(logFile, 'utf8')
        .split('\n')
        .find((l) => l.includes('"msg":"device cloned"') && l.includes('"device_id":"big-kid"'));
      const logged = JSON.parse(line ?? '{}') as { sync_ms?: number; total_ms?: number };
      console.info(
        `CloneDevice 1 GiB sparse, 100 MB written: clone_ms=${r.cloneMs} (cp) sync_ms=${logged.sync_ms?.toFixed(1)} (fsync+rename+dir fsync) ` +
          `total_ms=${logged.total_ms?.toFixed(1)} (in the manager) call_ms=${callMs.toFixed(1)} (the RPC as the client sees it: what it adds to the freeze window) ` +
          `copied_bytes=${r.copiedBytes} reflinked=${r.reflinked} clone_allocated=${allocated(r.device!.backingFile)}`,
      );
      expect(r.copiedBytes).toBeGreaterThan(100 * MIB);
      expect(allocated(r.device!.backingFile)).toBeLessThan(GIB / 4);
    } finally {
      execFileSync('umount', [mnt]);
    }
  });
});
