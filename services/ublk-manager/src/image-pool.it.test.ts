/**
 * Integration tests of the image pool and reflink clones (drivers/image-pool.ts, ficlone.ts,
 * empty-images.ts) with the real daemon (dist/main.js), real loop devices, XFS (the pool) and
 * ext4 (the images): the pool is made at the first start on an ext4 images dir, adopted after
 * kill -9 (mounted; attached but not mounted; not attached), grown when it fills; CloneDevice
 * is FICLONE (clone_method "reflink") and a clone of a device being written is e2fsck-clean
 * with the writer's stream cut at a prefix; a clone uses ~no pool space until it is written;
 * a source image that is a symlink or another file system's file is INVALID_ARGUMENT.
 * Needs root, loop devices, e2fsprogs, util-linux, xfsprogs, fsfreeze and an images dir
 * without reflink (the test host's ext4; skips otherwise). Everything made here (mounts, loop
 * devices, processes) is removed in afterAll; a leftover fails the suite.
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, statfsSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, UBLK_FEATURES } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { DeviceServiceDefinition, Filesystem } from '@sandnode/shared/proto/ublk/v1/ublk';
import { describeWith, expectCode, PARTS, type Part } from '@sandnode/testkit';
import { buildDaemon, cleanUpUnder, DAEMON_PARTS, isMounted, loopsUnder, MIB, spawnDaemon, tempRoot, waitForLog, type Daemon } from './__tests__/handover-harness';

jest.setTimeout(180_000);
const GIB = 1024 * MIB;

const XFSPROGS: Part = {
  name: 'xfsprogs (mkfs.xfs, xfs_growfs: apt-get install xfsprogs)',
  present: () => ['mkfs.xfs', 'xfs_growfs'].every((c) => spawnSync('sh', ['-c', `command -v ${c}`], { stdio: 'ignore' }).status === 0),
  ciProvides: true,
};

/** usedBytes is what the mounted file system at dir has allocated (statfs blocks - bfree), bytes. */
function usedBytes(dir: string): number {
  const st = statfsSync(dir);
  return (st.blocks - st.bfree) * st.bsize;
}

describeWith('ublk-manager image pool and reflink clones (loop driver, XFS pool on ext4)', [...DAEMON_PARTS, PARTS.fsfreeze, XFSPROGS], () => {
  let tmp: string;
  let stateDir: string;
  let imagesDir: string;
  let poolDir: string;
  let poolFile: string;
  let logFile: string;
  let daemon: Daemon | undefined;
  let channel: ReturnType<typeof createSandnodeChannel> | undefined;
  let client: ReturnType<typeof createServiceClient<typeof DeviceServiceDefinition>>;
  let writer: ChildProcess | undefined;
  const mnts: Record<string, string> = {};

  async function start(): Promise<Daemon> {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SANDNODE_')) env[k] = v;
    daemon = spawnDaemon(logFile, {
      ...env,
      SANDNODE_UBLK_MANAGER_STATE_DIR: stateDir,
      SANDNODE_UBLK_MANAGER_RUN_DIR: path.join(tmp, 'run'),
      SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'debug',
      SANDNODE_UBLK_MANAGER_IMAGE_POOL_INITIAL_BYTES: String(GIB),
      SANDNODE_UBLK_MANAGER_IMAGE_POOL_MAX_BYTES: String(4 * GIB),
      SANDNODE_UBLK_MANAGER_IMAGE_POOL_MIN_FREE_BYTES: String(256 * MIB),
      SANDNODE_UBLK_MANAGER_IMAGE_POOL_CHECK_MS: '0',
    });
    await waitForLog(logFile, daemon, '"msg":"serving"');
    channel?.close();
    channel = createSandnodeChannel(`unix://${path.join(tmp, 'run', 'ublk-manager.sock')}`);
    client = createServiceClient(DeviceServiceDefinition, channel, { timeoutMs: 60_000 });
    return daemon;
  }

  async function kill9(): Promise<void> {
    daemon?.proc.kill('SIGKILL');
    await daemon?.done;
    daemon = undefined;
  }

  /** poolState: the loop devices of the pool file and how many times the images dir is mounted. */
  function poolState(): { loops: string[]; mounts: number } {
    const loops = [...loopsUnder(poolDir).entries()].filter(([, f]) => f === poolFile).map(([d]) => d);
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .filter((l) => l.split(' ')[4] === imagesDir).length;
    return { loops, mounts };
  }

  function logHas(d: Daemon, text: string): boolean {
    return readFileSync(logFile, 'utf8')
      .split('\n')
      .some((l) => l.includes(`"pid":${d.pid},`) && l.includes(text));
  }

  function mountDev(name: string, dev: string, opts: string[] = []): string {
    const m = path.join(tmp, `mnt-${name}`);
    mkdirSync(m, { recursive: true });
    execFileSync('mount', [...opts, dev, m]);
    mnts[name] = m;
    return m;
  }

  function umountDev(name: string): void {
    const m = mnts[name];
    if (m) execFileSync('umount', [m]);
    delete mnts[name];
  }

  beforeAll(async () => {
    buildDaemon();
    tmp = tempRoot('ublk-pool-it');
    stateDir = path.join(tmp, 'state');
    imagesDir = path.join(stateDir, 'images');
    poolDir = path.join(stateDir, 'ublk-manager', 'pool');
    poolFile = path.join(poolDir, 'images.xfs');
    logFile = path.join(tmp, 'daemon.log');
    // the point of the pool is an images dir without reflink: the test host's ext4
    mkdirSync(tmp, { recursive: true });
    const probe = spawnSync('sh', ['-c', `head -c 4096 /dev/urandom > ${tmp}/p1 && cp --reflink=always ${tmp}/p1 ${tmp}/p2`]);
    rmSync(`${tmp}/p1`, { force: true });
    rmSync(`${tmp}/p2`, { force: true });
    if (probe.status === 0) throw new Error(`${tmp} has reflink already: this suite needs an images dir without it (ext4)`);
  }, 120_000);

  afterAll(async () => {
    if (!tmp) return;
    writer?.kill('SIGKILL');
    for (const m of Object.values(mnts)) spawnSync('umount', [m]);
    await kill9();
    channel?.close();
    cleanUpUnder(tmp);
  });

  it('makes the pool at the first start on an ext4 images dir: XFS with reflink on a loop device, mounted on the images dir', async () => {
    const d = await start();
    expect(logHas(d, 'made the pool')).toBe(true);
    expect(statSync(poolFile).size).toBe(GIB);
    expect(poolState()).toEqual({ loops: [expect.stringMatching(/^\/dev\/loop\d+$/)], mounts: 1 });
    expect(isMounted(imagesDir)).toBe(true);
    expect(execFileSync('findmnt', ['-n', '-o', 'FSTYPE', imagesDir], { encoding: 'utf8' }).trim()).toBe('xfs');
    const version = createServiceClient(VersionServiceDefinition, channel!, { timeoutMs: 5000 });
    expect((await version.getVersion({})).features).toContain(UBLK_FEATURES.reflinkClone);
  });

  it('makes empty ext4 devices from a reflink clone of a clean pre-formatted template; rebuilds a template that is not clean', async () => {
    const a = (await client.createDevice({ deviceId: 'parent', sizeBytes: 256 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    const tpl = path.join(imagesDir, '.templates', `ext4-${256 * MIB}.img`);
    expect(existsSync(tpl)).toBe(true);
    expect(spawnSync('e2fsck', ['-fn', a.backingFile]).status).toBe(0);
    expect(logHas(daemon!, '"made_by":"template"')).toBe(true);
    // a second device of that size shares the template's extents: almost no new space
    const before = usedBytes(imagesDir);
    const b = (await client.createDevice({ deviceId: 'ws', sizeBytes: 256 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    expect(usedBytes(imagesDir) - before).toBeLessThan(MIB);
    expect(spawnSync('e2fsck', ['-fn', b.backingFile]).status).toBe(0);
    // a template that is not clean (superblock zeroed) is rebuilt by a new manager process, not cloned
    await kill9();
    execFileSync('dd', ['if=/dev/zero', `of=${tpl}`, 'bs=1024', 'seek=1', 'count=1', 'conv=notrunc', 'status=none']);
    expect(spawnSync('e2fsck', ['-fn', tpl]).status).not.toBe(0);
    const d = await start();
    const c = (await client.createDevice({ deviceId: 'ws2', sizeBytes: 256 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    expect(logHas(d, 'rebuilding it')).toBe(true);
    expect(spawnSync('e2fsck', ['-fn', tpl]).status).toBe(0);
    expect(spawnSync('e2fsck', ['-fn', c.backingFile]).status).toBe(0);
    const m = mountDev('ws2', c.path);
    writeFileSync(path.join(m, 'x'), 'ok');
    umountDev('ws2');
    await client.deleteDevice({ deviceId: 'ws2' });
    await client.deleteDevice({ deviceId: 'ws' });
  });

  it('clones a device that is being written by FICLONE: clone_method reflink, e2fsck clean, the clone holds a prefix of the writer stream', async () => {
    const parent = (await client.getDevice({ deviceId: 'parent' })).device!;
    const pm = mountDev('parent', parent.path);
    execFileSync('dd', ['if=/dev/urandom', `of=${path.join(pm, 'bulk.bin')}`, 'bs=1M', 'count=64', 'status=none']);
    // a writer appends numbered lines without pause; the freeze blocks it, the thaw lets it go on
    writer = spawn('sh', ['-c', `i=0; while :; do echo "line-$i"; i=$((i+1)); done >> ${path.join(pm, 'stream.txt')}`], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 300));
    execFileSync('fsfreeze', ['--freeze', pm]);
    let res;
    try {
      res = await client.cloneDevice({ deviceId: 'child', sourceDeviceId: 'parent', sourceQuiesced: true, readOnly: false });
    } finally {
      execFileSync('fsfreeze', ['--unfreeze', pm]);
    }
    await new Promise((r) => setTimeout(r, 200));
    writer.kill('SIGKILL');
    writer = undefined;
    execFileSync('sync', ['-f', pm]);
    expect(res.cloneMethod).toBe('reflink');
    expect(res.reflinked).toBe(true);
    expect(res.copyReason).toBe('');
    const child = res.device!;
    expect(spawnSync('e2fsck', ['-fn', child.backingFile]).status).toBe(0);
    const cm = mountDev('child', child.path, ['-o', 'ro']);
    const parentStream = readFileSync(path.join(pm, 'stream.txt'), 'utf8');
    const childStream = readFileSync(path.join(cm, 'stream.txt'), 'utf8');
    expect(childStream.length).toBeGreaterThan(0);
    expect(childStream.length).toBeLessThan(parentStream.length);
    expect(parentStream.startsWith(childStream)).toBe(true);
    expect(readFileSync(path.join(cm, 'bulk.bin')).equals(readFileSync(path.join(pm, 'bulk.bin')))).toBe(true);
    umountDev('child');
  });

  it("a clone's extra disk use is ~0 until it writes; its writes are its own", async () => {
    const parent = (await client.getDevice({ deviceId: 'parent' })).device!;
    const pm = mnts.parent!;
    execFileSync('fsfreeze', ['--freeze', pm]);
    const poolAllocBefore = statSync(poolFile).blocks * 512;
    const usedBefore = usedBytes(imagesDir);
    let res;
    try {
      res = await client.cloneDevice({ deviceId: 'child2', sourceDeviceId: 'parent', sourceQuiesced: true, readOnly: false });
    } finally {
      execFileSync('fsfreeze', ['--unfreeze', pm]);
    }
    expect(res.cloneMethod).toBe('reflink');
    expect(res.copiedBytes).toBeGreaterThan(64 * MIB);
    // 64 MiB of data shared, not copied: the pool's file system and its file grow by < 1 MiB
    expect(usedBytes(imagesDir) - usedBefore).toBeLessThan(MIB);
    expect(statSync(poolFile).blocks * 512 - poolAllocBefore).toBeLessThan(MIB);
    expect(parent.backingFile).not.toBe(res.device!.backingFile);
    const cm = mountDev('child2', res.device!.path);
    execFileSync('dd', ['if=/dev/urandom', `of=${path.join(cm, 'own.bin')}`, 'bs=1M', 'count=16', 'status=none', 'conv=fsync']);
    umountDev('child2');
    expect(usedBytes(imagesDir) - usedBefore).toBeGreaterThanOrEqual(16 * MIB);
    expect(existsSync(path.join(pm, 'own.bin'))).toBe(false);
  });

  it('refuses a clone whose source image is a symlink or a file of another file system (INVALID_ARGUMENT), and makes nothing', async () => {
    const secret = path.join(tmp, 'secret.img');
    writeFileSync(secret, Buffer.alloc(4 * MIB, 7));
    for (const [id, plant] of [
      ['sym', (img: string) => symlinkSync(secret, img)],
      ['bind', (img: string) => (writeFileSync(img, ''), execFileSync('mount', ['--bind', secret, img]))],
    ] as const) {
      const dev = (await client.createDevice({ deviceId: id, sizeBytes: 4 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: true })).device!;
      // the row names <images>/<id>.img; what is there now is not the image the row was made with
      const moved = `${dev.backingFile}.moved`;
      renameSync(dev.backingFile, moved);
      plant(dev.backingFile);
      try {
        await expectCode(
          client.cloneDevice({ deviceId: `${id}-kid`, sourceDeviceId: id, sourceQuiesced: true, readOnly: false }),
          Status.INVALID_ARGUMENT,
          id === 'sym' ? /symbolic link/ : /not on the images file system/,
        );
        await expectCode(client.getDevice({ deviceId: `${id}-kid` }), Status.NOT_FOUND);
        expect(existsSync(path.join(imagesDir, `${id}-kid.img`))).toBe(false);
      } finally {
        if (id === 'bind') execFileSync('umount', [dev.backingFile]);
        rmSync(dev.backingFile, { force: true });
        renameSync(moved, dev.backingFile);
      }
      await client.deleteDevice({ deviceId: id });
    }
    expect(readFileSync(secret).equals(Buffer.alloc(4 * MIB, 7))).toBe(true);
  });

  it('adopts the pool after kill -9: mounted (reused), attached but not mounted, not attached; never a second pool or loop device', async () => {
    const listed = async () => (await client.listDevices({})).devices.map((d) => d.deviceId).sort();
    const ids = await listed();
    const loop0 = poolState().loops[0];
    await kill9();
    let d = await start();
    expect(logHas(d, 'reused the mounted pool')).toBe(true);
    expect(poolState()).toEqual({ loops: [loop0], mounts: 1 });
    expect(await listed()).toEqual(ids);
    // empty the pool of devices so it can be unmounted under the manager's feet
    for (const name of Object.keys(mnts)) umountDev(name);
    for (const id of ids) await client.deleteDevice({ deviceId: id });
    await kill9();
    execFileSync('umount', [imagesDir]);
    d = await start();
    expect(logHas(d, `mounted the attached pool (${loop0})`)).toBe(true);
    expect(poolState()).toEqual({ loops: [loop0], mounts: 1 });
    await kill9();
    execFileSync('umount', [imagesDir]);
    execFileSync('losetup', ['-d', loop0!]);
    d = await start();
    expect(logHas(d, 'attached and mounted the pool file')).toBe(true);
    expect(poolState()).toEqual({ loops: [expect.stringMatching(/^\/dev\/loop\d+$/)], mounts: 1 });
    expect(logHas(d, 'made the pool')).toBe(false);
    // the templates survived in the pool
    expect(existsSync(path.join(imagesDir, '.templates', `ext4-${256 * MIB}.img`))).toBe(true);
  });

  it('grows the pool when it fills (truncate, losetup -c, xfs_growfs) before it makes an image', async () => {
    const filler = path.join(imagesDir, '.filler');
    const free = statfsSync(imagesDir).bavail * statfsSync(imagesDir).bsize;
    execFileSync('fallocate', ['-l', String(free - 128 * MIB), filler]);
    const sizeBefore = statfsSync(imagesDir).blocks * statfsSync(imagesDir).bsize;
    const dev = (await client.createDevice({ deviceId: 'after-full', sizeBytes: 64 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false })).device!;
    expect(statSync(poolFile).size).toBe(2 * GIB);
    expect(statfsSync(imagesDir).blocks * statfsSync(imagesDir).bsize).toBeGreaterThan(sizeBefore + 900 * MIB);
    expect(logHas(daemon!, 'image pool grown')).toBe(true);
    expect(spawnSync('e2fsck', ['-fn', dev.backingFile]).status).toBe(0);
    rmSync(filler);
    await client.deleteDevice({ deviceId: 'after-full' });
  });
});
