import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { FailedPreconditionError, type RunResult } from '@sandnode/shared';
import { describeWith, PARTS, useTempDir, type Part } from '@sandnode/testkit';
import { parseUblkFeatures, parseUblkList, UBLK_CONTROL, UblkDriver } from './ublk';

/** A fake run: records argv, answers from a table of "cmd args" prefixes. */
function fakeRun(answers: Record<string, string | Error>) {
  const calls: string[] = [];
  const run = async (cmd: string, args: string[]): Promise<RunResult> => {
    const line = [cmd, ...args].join(' ');
    calls.push(line);
    const key = Object.keys(answers).find((k) => line.startsWith(k));
    const a = key === undefined ? '' : answers[key];
    if (a instanceof Error) throw a;
    return { stdout: a ?? '', stderr: '' };
  };
  return { run, calls };
}

describe('UblkDriver command sequences (fake run)', () => {
  const tempDir = useTempDir('ublk-drv');
  let dir: string;
  let control: string;
  let image: string;
  beforeEach(() => {
    dir = tempDir();
    control = path.join(dir, 'ublk-control');
    writeFileSync(control, '');
    image = path.join(dir, 'x.img');
    writeFileSync(image, 'data');
  });

  it('fails at start naming /dev/ublk-control, then the missing server program', async () => {
    await expect(new UblkDriver({ controlPath: path.join(dir, 'none') }).checkAvailable()).rejects.toThrow(`${path.join(dir, 'none')} is missing (the kernel has no ublk`);
    expect(UBLK_CONTROL).toBe('/dev/ublk-control');
    const { run } = fakeRun({ 'ublk list': new Error('spawn ublk ENOENT') });
    const err = await new UblkDriver({ controlPath: control, run }).checkAvailable().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FailedPreconditionError);
    expect((err as Error).message).toMatch(/ublk server program "ublk" \(config ublkServer\) cannot run/);
  });

  it('detects capabilities from `ublk features`, else from the ublk_drv module in sysfs', async () => {
    expect(parseUblkFeatures('UBLK_F_SUPPORT_ZERO_COPY\nUBLK_F_USER_RECOVERY\nUBLK_F_USER_RECOVERY_REISSUE\nUBLK_F_QUIESCE\n')).toEqual(['quiesce', 'user-recovery', 'reissue']);
    const a = fakeRun({ 'ublk features': 'UBLK_F_USER_RECOVERY\n' });
    const d = new UblkDriver({ controlPath: control, run: a.run });
    await d.checkAvailable();
    expect(d.capabilities()).toEqual(['user-recovery']);
    const b = fakeRun({ 'ublk features': new Error('unknown command') });
    const sys = path.join(dir, 'sys');
    spawnSync('mkdir', ['-p', path.join(sys, 'module', 'ublk_drv', 'parameters')]);
    const d2 = new UblkDriver({ controlPath: control, run: b.run, sysfsRoot: sys });
    await d2.checkAvailable();
    expect(d2.capabilities()).toEqual(['user-recovery', 'reissue']);
  });

  it('add / list / quiesce / release / recover / del run the documented commands', async () => {
    const killed: [number, string][] = [];
    const f = fakeRun({
      'ublk features': 'UBLK_F_USER_RECOVERY UBLK_F_USER_RECOVERY_REISSUE UBLK_F_QUIESCE',
      'ublk add': 'dev id 3: nr_hw_queues 1 queue_depth 128 block size 512 dev_capacity 2048\n',
      'ublk list': `dev id 3: nr_hw_queues 1 queue_depth 128\n\tmax rq size 524288 daemon pid 4242 flags 0x1a state LIVE\n\ttarget {"backing_file":"${image}","dev_size":1048576,"name":"loop"}\n`,
    });
    const d = new UblkDriver({ server: 'ublk', controlPath: control, run: f.run, kill: (pid, sig) => killed.push([pid, sig]) });
    await d.checkAvailable();
    const dev = await d.attach(image, { readOnly: false });
    expect(dev).toMatchObject({ path: '/dev/ublkb3', backingFile: image });
    expect(await d.listAttached(dir)).toEqual([{ path: '/dev/ublkb3', backingFile: image, readOnly: false, flags: ['QUIESCE', 'USER_RECOVERY', 'REISSUE'] }]);
    await d.quiesce(dev);
    await d.release(dev);
    await d.recover(dev);
    await d.detach(dev.path);
    expect(f.calls).toEqual([
      'ublk list',
      'ublk features',
      `ublk add -t loop -f ${image} --recovery 1 --recovery_reissue 1`,
      'ublk list',
      'ublk quiesce -n 3',
      'ublk list -n 3',
      'ublk recover -n 3',
      'ublk del -n 3',
    ]);
    expect(killed).toEqual([[4242, 'SIGKILL']]);
  });

  it('without USER_RECOVERY, release and recover are FAILED_PRECONDITION (callers pause sandboxes instead)', async () => {
    const f = fakeRun({ 'ublk features': '' });
    const d = new UblkDriver({ controlPath: control, run: f.run });
    await d.checkAvailable();
    const dev = { path: '/dev/ublkb1', backingFile: image, readOnly: false, flags: [] };
    await expect(d.release(dev)).rejects.toBeInstanceOf(FailedPreconditionError);
    await expect(d.recover(dev)).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(f.calls.some((c) => c.includes('--recovery_reissue'))).toBe(false);
  });

  it('parses ublk list blocks', () => {
    expect(parseUblkList('dev id 0: x\n state QUIESCED pid 7\n file: /i/a.img\ndev id 1: y\n')).toEqual([
      { id: 0, pid: 7, backingFile: '/i/a.img', state: 'QUIESCED' },
      { id: 1, pid: 0, backingFile: '', state: '' },
    ]);
  });
});

/** The ublk server program (ublksrv); like /dev/ublk-control, not something CI has here. */
const UBLKSRV: Part = {
  name: 'the ublk server program "ublk" (ublksrv)',
  present: () => spawnSync('sh', ['-c', 'command -v ublk'], { stdio: 'ignore' }).status === 0,
  ciProvides: false,
};

// PARTS.ublk is /dev/ublk-control (modprobe ublk_drv, kernel >= 6.0): skips here, also under CI=true.
describeWith('UblkDriver on a real kernel', [PARTS.ublk, UBLKSRV], () => {
  const tempDir = useTempDir('ublk-real');
  it('adds, recovers and deletes a device', async () => {
    const image = path.join(tempDir(), 'r.img');
    spawnSync('truncate', ['-s', '16M', image]);
    const d = new UblkDriver();
    await d.checkAvailable();
    const dev = await d.attach(image, { readOnly: false });
    try {
      if (d.capabilities().includes('user-recovery')) {
        await d.quiesce(dev);
        await d.release(dev);
        await d.recover(dev);
      }
    } finally {
      await d.detach(dev.path);
    }
  });
});
