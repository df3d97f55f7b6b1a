/**
 * Reflink bench (section "reflink"): the same forks on two nodes in one run, one after the
 * other: "pool" (the ublk-manager's defaults: on this host's ext4 it makes its XFS image pool
 * and clones by FICLONE) and "copy" (`SANDNODE_UBLK_MANAGER_IMAGE_POOL=false`: the ext4 copy
 * path). On each, a running parent with 100 MB and then 1 GB (BENCH_REFLINK_MB, default
 * "100,1000") written in /workspace is forked BENCH_REFLINK_FORKS times (default 10), each
 * child deleted after its fork. Measures the parent's freeze window (podd: first FIFREEZE to
 * last FITHAW) p50/p99, the fork as the client sees it p50, CloneDevice's clone_ms p50, and a
 * child's extra disk use right after its fork: the growth of the pool's file system (pool;
 * st_blocks would count shared extents) or the child images' allocated blocks (copy).
 * Goals (issue 14): freeze p99 <= 50 ms, fork p50 <= 150 ms, extra disk ~0, with the pool.
 */
import { readFileSync, statfsSync, statSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { connectServer, COMPONENTS, logFile, percentile, purgeNode, startComponent, stopComponent, type ServerApi, type StackDirs } from '@sandnode/node-stack';

const r1 = (x: number) => Math.round(x * 10) / 10;
const MB = 1e6;
const GIB = 2 ** 30;

/** One (mode, size) cell of the bench, times in ms, bytes in bytes. */
export interface ReflinkCell {
  mode: 'pool' | 'copy';
  workspaceMB: number;
  forks: number;
  cloneMethod: string;
  freezeP50Ms: number;
  freezeP99Ms: number;
  forkP50Ms: number;
  cloneP50Ms: number;
  /** a child's extra host disk use right after its fork (p50 over the forks), bytes */
  childExtraBytesP50: number;
  /** CloneDevice's whole time in the ublk-manager (checks, FICLONE or copy, fsyncs, rows, losetup) p50 per device, from its log, ms */
  cloneCallP50Ms: number;
  /** forks that failed (the first three messages in failures) */
  failedForks: number;
  failures: string[];
}

/** What benchReflink measured. */
export interface ReflinkBench {
  cells: ReflinkCell[];
  goals: { freezeP99Ms: number; forkP50Ms: number };
  note: string;
}

async function execOk(api: ServerApi, id: string, argv: string[]): Promise<void> {
  for await (const ev of api.sandboxes.exec({ sandboxId: id, argv })) {
    if (ev.event?.$case === 'exit' && ev.event.value.exitCode !== 0) throw new Error(`${argv.join(' ')} in ${id} exited ${ev.event.value.exitCode}`);
  }
}

/** childExtraBytes is what a child's images add on the host: pool growth (pool) or their allocated blocks (copy). */
function makeDiskProbe(dirs: StackDirs, mode: 'pool' | 'copy'): { before(): number; extra(before: number, backingFiles: string[]): number } {
  const images = path.join(dirs.stateDir, 'images');
  const used = () => {
    const st = statfsSync(images);
    return (st.blocks - st.bfree) * st.bsize;
  };
  return {
    before: () => (mode === 'pool' ? used() : 0),
    extra: (before, files) => (mode === 'pool' ? used() - before : files.reduce((a, f) => a + statSync(f).blocks * 512, 0)),
  };
}

/** lastCloneMethod reads the ublk-manager's last "device cloned" log line: "reflink" or "copy (<reason>)". */
function lastCloneMethod(dirs: StackDirs): string {
  const lines = readFileSync(logFile(dirs, 'ublk-manager'), 'utf8').trim().split('\n').reverse();
  for (const l of lines) {
    if (!l.includes('"device cloned"')) continue;
    const j = JSON.parse(l) as { reflinked?: boolean; copy_reason?: string };
    return j.reflinked ? 'reflink' : `copy: ${j.copy_reason ?? '?'}`;
  }
  return '?';
}

/** cloneTotals: total_ms of the "device cloned" log lines written after offset mark. */
function cloneTotals(dirs: StackDirs, mark: number): number[] {
  return readFileSync(logFile(dirs, 'ublk-manager'), 'utf8')
    .slice(mark)
    .split('\n')
    .filter((l) => l.includes('"device cloned"'))
    .map((l) => (JSON.parse(l) as { total_ms: number }).total_ms);
}

async function runMode(root: string, mode: 'pool' | 'copy', sizesMB: number[], forks: number): Promise<ReflinkCell[]> {
  const dirs: StackDirs = { stateDir: path.join(root, `reflink-${mode}`, 'state'), runDir: path.join(root, `reflink-${mode}`, 'run'), listen: '' };
  const saved = process.env.SANDNODE_UBLK_MANAGER_IMAGE_POOL;
  if (mode === 'copy') process.env.SANDNODE_UBLK_MANAGER_IMAGE_POOL = 'false';
  const cells: ReflinkCell[] = [];
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    const ublkCh = createSandnodeChannel(unixAddress(socketPath(dirs.runDir, 'ublk-manager')));
    const ublk = createServiceClient(DeviceServiceDefinition, ublkCh, { timeoutMs: 10_000 });
    const probe = makeDiskProbe(dirs, mode);
    try {
      await api.templates.buildTemplate({ name: 'base', replace: false });
      for (const mb of sizesMB) {
        const diskBytes = Math.max(GIB, Math.ceil((mb * MB * 2) / GIB) * GIB);
        const parent = (await api.sandboxes.createSandbox({ template: 'base', resources: { diskBytes } })).sandbox!.sandboxId;
        try {
          await execOk(api, parent, ['dd', 'if=/dev/urandom', 'of=/workspace/blob', 'bs=1M', `count=${Math.round((mb * MB) / 2 ** 20)}`, 'conv=fsync']);
          const freeze: number[] = [];
          const fork: number[] = [];
          const clone: number[] = [];
          const extra: number[] = [];
          const failed: string[] = [];
          const logMark = readFileSync(logFile(dirs, 'ublk-manager'), 'utf8').length;
          let method = '';
          for (let i = 0; i < forks; i++) {
            const before = probe.before();
            const t0 = performance.now();
            let r;
            try {
              r = await api.sandboxes.forkSandbox({ parentId: parent });
            } catch (err) {
              // a fork the server gave up on (e.g. ABORTED: the clone overran the freeze window) is counted, not hidden
              failed.push((err as Error).message.slice(0, 200));
              continue;
            }
            fork.push(performance.now() - t0);
            freeze.push(r.parentHeldMs);
            clone.push(r.cloneMs);
            const kid = r.sandbox!.sandboxId;
            const devs = (await ublk.listDevices({})).devices.filter((d) => d.deviceId.startsWith(`${kid}-`));
            extra.push(
              probe.extra(
                before,
                devs.map((d) => d.backingFile),
              ),
            );
            method = lastCloneMethod(dirs);
            await api.sandboxes.deleteSandbox({ sandboxId: kid });
          }
          cells.push({
            mode,
            workspaceMB: mb,
            forks,
            cloneMethod: method,
            freezeP50Ms: r1(percentile(freeze, 50)),
            freezeP99Ms: r1(percentile(freeze, 99)),
            forkP50Ms: r1(percentile(fork, 50)),
            cloneP50Ms: r1(percentile(clone, 50)),
            childExtraBytesP50: Math.round(percentile(extra, 50)),
            cloneCallP50Ms: r1(percentile(cloneTotals(dirs, logMark), 50)),
            failedForks: failed.length,
            failures: failed.slice(0, 3),
          });
        } finally {
          await api.sandboxes.deleteSandbox({ sandboxId: parent }).catch(() => undefined);
        }
      }
    } finally {
      api.close();
      ublkCh.close();
    }
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c);
  } finally {
    if (saved === undefined) delete process.env.SANDNODE_UBLK_MANAGER_IMAGE_POOL;
    else process.env.SANDNODE_UBLK_MANAGER_IMAGE_POOL = saved;
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
  return cells;
}

/** benchReflink runs the pool and the copy path in one run; rows get one table line per cell. */
export async function benchReflink(root: string, rows: (string | number)[][]): Promise<ReflinkBench> {
  const sizes = (process.env.BENCH_REFLINK_MB ?? '100,1000')
    .split(',')
    .map(Number)
    .filter((n) => n > 0);
  const forks = Math.max(1, Number(process.env.BENCH_REFLINK_FORKS ?? 10));
  const cells = [...(await runMode(root, 'pool', sizes, forks)), ...(await runMode(root, 'copy', sizes, forks))];
  for (const c of cells) {
    rows.push([
      `fork ${c.mode} (${c.cloneMethod}), ${c.workspaceMB} MB in /workspace: freeze p50 / p99, fork p50, clone p50, child extra disk`,
      `${c.freezeP50Ms} / ${c.freezeP99Ms} ms, ${c.forkP50Ms} ms, ${c.cloneP50Ms} ms (CloneDevice ${c.cloneCallP50Ms} ms), ${r1(c.childExtraBytesP50 / 2 ** 20)} MiB${c.failedForks ? `, ${c.failedForks} failed` : ''}`,
      c.mode === 'pool' ? 'freeze p99 <= 50 ms, fork p50 <= 150 ms, extra ~0' : 'baseline (copy)',
      `${c.forks - c.failedForks}/${c.forks} forks`,
    ]);
  }
  return { cells, goals: { freezeP99Ms: 50, forkP50Ms: 150 }, note: 'same run, pool node then copy node; the host is shared with other work, timings are noisy' };
}
