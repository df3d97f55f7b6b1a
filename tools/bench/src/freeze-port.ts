/**
 * The freeze port under abuse and its cost (part of `npm run bench`, section `freeze-port`;
 * issue 10 §3), on a node of its own with one sandbox:
 * - memory: the supervisor's VmRSS (and VmHWM, its peak) before and after BENCH_FREEZE_STREAMS
 *   (default 120) streams of 4 MiB partial gRPC messages on the sandbox's freeze socket, each
 *   on its own connection, held BENCH_FREEZE_HOLD_MS (default 3000) before they are closed;
 * - CPU: host CPU (ms: utime + stime + cutime + cstime of /proc/<pid>/stat, the supervisor and
 *   the node's freeze watchdog) of BENCH_FREEZE_CYCLES (default 200) freeze/thaw cycles, each
 *   armed as a fork arms it (VmService.ArmFreeze, FreezeFilesystems, ThawFilesystems);
 * - the baseline, same run: the host processes the supervisor started per cycle before 0.3.0
 *   (`runc state`, the `/bin/sh -c 'sleep ...'` watchdog, `fsfreeze -f` and `fsfreeze -u` of
 *   both filesystems), started the same way by this process on the same sandbox, and their CPU
 *   (this process's own CPU for the starts plus its children's);
 * - process starts per cycle: counted with strace(1) -f on the supervisor over 20 cycles when
 *   strace is installed (the baseline's are the 7 it starts).
 */
import { spawn, spawnSync } from 'node:child_process';
import http2 from 'node:http2';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { FreezePortServiceDefinition, VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { COMPONENTS, connectServer, purgeNode, sandnodeProcesses, startComponent, stopComponent, type StackDirs } from '@sandnode/node-stack';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
/** Clock ticks per second of /proc/<pid>/stat (USER_HZ). */
const CLK_TCK = 100;
const MIB = 1024 * 1024;

/** What the section reports. */
export interface FreezePortBench {
  streams: number;
  rssBeforeMib: number;
  rssAfterMib: number;
  hwmAfterMib: number;
  /** streams the server answered (RESOURCE_EXHAUSTED) or closed while they were held */
  streamsEnded: number;
  cycles: number;
  cpuMs: number;
  cpuMsPerCycle: number;
  baselineCycles: number;
  baselineCpuMs: number;
  baselineCpuMsPerCycle: number;
  /** process starts per cycle counted by strace (undefined without strace) */
  spawnsPerCycle: number | undefined;
  baselineSpawnsPerCycle: number;
}

/** cpuMs is utime + stime (+ cutime + cstime: reaped children) of pid, ms. */
function cpuMs(pid: number | 'self'): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields 14-17 (utime stime cutime cstime) are at 11-14 after the state field (3)
  return ([11, 12, 13, 14].map((i) => Number(f[i])).reduce((a, b) => a + b, 0) * 1000) / CLK_TCK;
}

function statusMib(pid: number, key: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Math.round(Number(m?.[1] ?? 0) / 1024);
}

/** abusiveStream opens a connection and one stream whose message says 4 MiB and sends nearly all of it, never ending. */
function abusiveStream(sock: string): { ended: () => boolean; close: () => void } {
  const session = http2.connect('http://localhost', { createConnection: () => net.createConnection(sock) });
  let ended = false;
  session.on('error', () => (ended = true));
  session.on('close', () => (ended = true));
  const st = session.request({ ':method': 'POST', ':path': '/sandnode.vmm.v1.FreezePortService/FreezeFilesystems', 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
  st.on('error', () => (ended = true));
  st.on('response', (h) => {
    if (h['grpc-status'] !== undefined) ended = true;
  });
  st.on('trailers', () => (ended = true));
  st.on('close', () => (ended = true));
  st.on('data', () => undefined);
  const h = Buffer.alloc(5);
  h.writeUInt32BE(4 * MIB, 1);
  st.write(h);
  st.write(Buffer.alloc(4 * MIB - 1024, 7));
  return { ended: () => ended, close: () => session.destroy() };
}

/** countSpawns follows pid with strace -f while fn runs; returns the processes started (clones that are not threads), or undefined without strace. */
async function countSpawns(pid: number, fn: () => Promise<void>): Promise<number | undefined> {
  if (spawnSync('/bin/sh', ['-c', 'command -v strace'], { stdio: 'ignore' }).status !== 0) return undefined;
  const tracer = spawn('strace', ['-f', '-qq', '-e', 'trace=clone,clone3,fork,vfork', '-e', 'signal=none', '-p', String(pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let out = '';
  tracer.stderr.on('data', (d: Buffer) => (out += d.toString()));
  for (let i = 0; i < 500 && !/TracerPid:\s+[1-9]/.test(readFileSync(`/proc/${pid}/status`, 'utf8')); i++) await new Promise((r) => setTimeout(r, 10));
  try {
    await fn();
  } finally {
    tracer.kill('SIGINT');
    await new Promise((r) => tracer.once('exit', r));
  }
  return out.split('\n').filter((l) => /\b(clone3?|v?fork)\(/.test(l) && !/CLONE_THREAD/.test(l) && !/resumed/.test(l)).length;
}

/** run starts cmd and waits for it (its exit code is not checked: the baseline only costs). */
function run(cmd: string, args: string[]): void {
  spawnSync(cmd, args, { stdio: 'ignore' });
}

/**
 * baselineCycle does what a 0.2.0 supervisor started per freeze/thaw: `runc state`, the sh
 * watchdog (sleep in it), FIFREEZE and FITHAW of each mount with fsfreeze(8), then kills the
 * watchdog's group.
 */
function baselineCycle(runcRoot: string, vmId: string, mounts: string[]): void {
  run('runc', ['--root', runcRoot, 'state', vmId]);
  const wd = spawn('/bin/sh', ['-c', 's=$1; shift; sleep "$s"; for m in "$@"; do fsfreeze -u "$m" 2>/dev/null; done', 'sandnode-freeze-watchdog', '5', ...mounts], { detached: true, stdio: 'ignore' });
  for (const m of mounts) run('fsfreeze', ['-f', m]);
  for (const m of mounts) run('fsfreeze', ['-u', m]);
  try {
    process.kill(-wd.pid!, 'SIGKILL');
  } catch {
    /* gone */
  }
}

/** benchFreezePort runs the section on a node under root; rows get the table lines. */
export async function benchFreezePort(root: string, rows: (string | number)[][]): Promise<FreezePortBench> {
  const dirs: StackDirs = { stateDir: path.join(root, 'fz-state'), runDir: path.join(root, 'fz-run'), listen: '' };
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    await api.templates.buildTemplate({ name: 'base', replace: false });
    const id = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    const vmDir = path.join(dirs.runDir, 'vms', id);
    const sock = path.join(vmDir, 'freeze-port', 'freeze.sock');
    const sup = sandnodeProcesses(dirs.runDir).find((p) => /vmm-supervisor\/dist\/main\.js/.test(p.cmd));
    if (!sup) throw new Error('no vmm-supervisor process found');
    const vmmCh = createSandnodeChannel(unixAddress(socketPath(dirs.runDir, 'vmm-supervisor')));
    const epoch = (await createServiceClient(VmServiceDefinition, vmmCh, { timeoutMs: 10_000 }).listVms({})).fenceEpoch;
    const vmm = createServiceClient(VmServiceDefinition, vmmCh, { timeoutMs: 10_000, epoch: () => epoch });
    const port = createServiceClient(FreezePortServiceDefinition, createSandnodeChannel(unixAddress(sock)), { timeoutMs: 10_000, retryAttempts: 1 });
    const cycle = async () => {
      await vmm.armFreeze({ vmId: id, windowMs: 0 });
      const f = await port.freezeFilesystems({ maxFreezeMs: 2000 });
      await port.thawFilesystems({ freezeToken: f.freezeToken });
    };
    await cycle(); // the node's first freeze starts the watchdog: not counted

    // memory under 120 abusive streams
    const n = num('BENCH_FREEZE_STREAMS', 120);
    const rssBeforeMib = statusMib(sup.pid, 'VmRSS');
    const streams = Array.from({ length: n }, () => abusiveStream(sock));
    await new Promise((r) => setTimeout(r, num('BENCH_FREEZE_HOLD_MS', 3000)));
    const rssAfterMib = statusMib(sup.pid, 'VmRSS');
    const hwmAfterMib = statusMib(sup.pid, 'VmHWM');
    const streamsEnded = streams.filter((s) => s.ended()).length;
    for (const s of streams) s.close();
    await new Promise((r) => setTimeout(r, 500));

    // CPU of freeze/thaw cycles
    const cycles = num('BENCH_FREEZE_CYCLES', 200);
    const wd = JSON.parse(readFileSync(path.join(dirs.runDir, 'freeze-watchdog', 'watchdog.json'), 'utf8')) as { pid: number };
    const c0 = cpuMs(sup.pid) + cpuMs(wd.pid);
    for (let i = 0; i < cycles; i++) await cycle();
    const cpu = cpuMs(sup.pid) + cpuMs(wd.pid) - c0;
    const spawns = await countSpawns(sup.pid, async () => {
      for (let i = 0; i < 20; i++) await cycle();
    });

    // the baseline: the 0.2.0 way, on the same mounts
    const baselineCycles = num('BENCH_FREEZE_BASELINE_CYCLES', 50);
    const mounts = [path.join(vmDir, 'upper-dev'), path.join(vmDir, 'workspace')];
    const b0 = cpuMs('self');
    for (let i = 0; i < baselineCycles; i++) baselineCycle(path.join(dirs.runDir, 'runc'), id, mounts);
    const baselineCpuMs = cpuMs('self') - b0;

    await api.sandboxes.deleteSandbox({ sandboxId: id });
    api.close();
    vmmCh.close();
    const r: FreezePortBench = {
      streams: n,
      rssBeforeMib,
      rssAfterMib,
      hwmAfterMib,
      streamsEnded,
      cycles,
      cpuMs: Math.round(cpu),
      cpuMsPerCycle: Math.round((cpu / cycles) * 100) / 100,
      baselineCycles,
      baselineCpuMs: Math.round(baselineCpuMs),
      baselineCpuMsPerCycle: Math.round((baselineCpuMs / baselineCycles) * 100) / 100,
      spawnsPerCycle: spawns === undefined ? undefined : spawns / 20,
      baselineSpawnsPerCycle: 7,
    };
    rows.push([
      `freeze port: supervisor RSS before / after ${n} streams of 4 MiB partial messages`,
      `${rssBeforeMib} / ${rssAfterMib} MiB (peak ${hwmAfterMib})`,
      'bounded (was 78 -> 581)',
      `${streamsEnded}/${n} answered at once`,
    ]);
    rows.push([
      `freeze port: host CPU of ${cycles} armed freeze/thaw cycles`,
      `${r.cpuMs} ms (${r.cpuMsPerCycle} ms/cycle)`,
      `0.2.0 way, same run: ${r.baselineCpuMsPerCycle} ms/cycle`,
      `process starts/cycle ${r.spawnsPerCycle ?? 'n/a (no strace)'} (was 7)`,
    ]);
    return r;
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
}
