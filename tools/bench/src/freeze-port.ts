/**
 * The freeze port under abuse and its cost (part of `npm run bench`, section `freeze-port`;
 * issue 10 §3), on a node of its own with one sandbox:
 * - memory: the supervisor's VmRSS (and VmHWM, its peak) before and while BENCH_FREEZE_STREAMS
 *   (default 120) streams of 4 MiB partial gRPC messages are sent on the sandbox's freeze
 *   socket over BENCH_FREEZE_CONNECTIONS (default 8) connections, held BENCH_FREEZE_HOLD_MS
 *   (default 3000) before they are closed;
 * - CPU: host CPU (ms: utime + stime + cutime + cstime of /proc/<pid>/stat, the supervisor and
 *   the node's freeze watchdog) of BENCH_FREEZE_CYCLES (default 200) freeze/thaw cycles, each
 *   armed as a fork arms it (VmService.ArmFreeze, FreezeFilesystems, ThawFilesystems);
 * - the baseline, same run, same sandbox: the 0.2.0 vmm-supervisor (the compat cache's build
 *   `compat-tests/.cache/builds/0.2.0-<sha>`, or BENCH_FREEZE_BASELINE_BUILD; it adopts the
 *   node's VMs) takes the same streams and BENCH_FREEZE_BASELINE_CYCLES (default 200) unarmed
 *   cycles (it has no arming); without that build, the host processes it started per cycle
 *   (`runc state`, the `/bin/sh -c 'sleep ...'` watchdog, `fsfreeze -f` / `-u` of both
 *   filesystems) are started the same way by this process and their CPU counted ("replayed");
 * - process starts per cycle: counted with strace(1) -f on the supervisor over 20 cycles when
 *   strace is installed.
 */
import { spawn, spawnSync } from 'node:child_process';
import http2 from 'node:http2';
import { existsSync, readFileSync } from 'node:fs';
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
  /** streams the server does not hold after BENCH_FREEZE_HOLD_MS (answered RESOURCE_EXHAUSTED, refused, closed, or kept waiting by its stream limit) */
  streamsEnded: number;
  cycles: number;
  cpuMs: number;
  cpuMsPerCycle: number;
  /** "0.2.0 supervisor" (the release's daemon, same run) or "replayed" (its host processes, started by the bench) */
  baseline: string;
  baselineRssBeforeMib: number | undefined;
  baselineRssAfterMib: number | undefined;
  baselineStreamsEnded: number | undefined;
  baselineCycles: number;
  baselineCpuMs: number;
  baselineCpuMsPerCycle: number;
  /** process starts per cycle counted by strace (undefined without strace) */
  spawnsPerCycle: number | undefined;
  /** the baseline's: by strace on the 0.2.0 supervisor, else the 7 the replay starts */
  baselineSpawnsPerCycle: number | undefined;
}

/** baselineBuild is the 0.2.0 build to compare with (BENCH_FREEZE_BASELINE_BUILD, else the compat cache's), or undefined. */
function baselineBuild(): string | undefined {
  if (process.env.BENCH_FREEZE_BASELINE_BUILD) return process.env.BENCH_FREEZE_BASELINE_BUILD;
  const repo = path.resolve(__dirname, '..', '..', '..');
  try {
    const rel = (JSON.parse(readFileSync(path.join(repo, 'compat-tests', 'releases.json'), 'utf8')) as { version: string; commit: string }[]).find((r) => r.version === '0.2.0');
    const dir = rel && path.join(repo, 'compat-tests', '.cache', 'builds', `${rel.version}-${rel.commit.slice(0, 12)}`);
    return dir && existsSync(path.join(dir, 'services', 'vmm-supervisor', 'dist', 'main.js')) ? dir : undefined;
  } catch {
    return undefined;
  }
}

/** supervisorPid is the node's running vmm-supervisor. */
function supervisorPid(dirs: StackDirs): number {
  const sup = sandnodeProcesses(dirs.runDir).find((p) => /vmm-supervisor\/dist\/main\.js/.test(p.cmd));
  if (!sup) throw new Error('no vmm-supervisor process found');
  return sup.pid;
}

/**
 * underStreams measures pid's VmRSS before and while n abusive streams are sent on sock over
 * BENCH_FREEZE_CONNECTIONS (default 8) connections; closed after. ended: streams the server
 * does not hold (answered, refused, closed, or never let start by its stream limit).
 */
async function underStreams(pid: number, sock: string, n: number): Promise<{ before: number; after: number; hwm: number; ended: number; started: number }> {
  const before = statusMib(pid, 'VmRSS');
  const conns = num('BENCH_FREEZE_CONNECTIONS', 8);
  const a = abusiveStreams(sock, conns, Math.ceil(n / conns));
  await new Promise((r) => setTimeout(r, num('BENCH_FREEZE_HOLD_MS', 3000)));
  const held = a.streams.filter((s) => s.started() && !s.ended()).length;
  const r = { before, after: statusMib(pid, 'VmRSS'), hwm: statusMib(pid, 'VmHWM'), ended: a.streams.length - held, started: a.streams.filter((s) => s.started()).length };
  a.close();
  await new Promise((res) => setTimeout(res, 500));
  return r;
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

/** One abusive stream: whether the server answered or ended it, and whether it ever started (not queued by the client behind the peer's stream limit). */
interface Abusive {
  ended: () => boolean;
  started: () => boolean;
}

/**
 * abusiveStreams opens conns connections with perConn streams each; every stream's message
 * says 4 MiB and it sends nearly all of it, never ending. close() destroys the connections.
 */
function abusiveStreams(sock: string, conns: number, perConn: number): { streams: Abusive[]; close: () => void } {
  const sessions: http2.ClientHttp2Session[] = [];
  const streams: Abusive[] = [];
  for (let c = 0; c < conns; c++) {
    const session = http2.connect('http://localhost', { createConnection: () => net.createConnection(sock) });
    let gone = false;
    session.on('error', () => (gone = true));
    session.on('close', () => (gone = true));
    sessions.push(session);
    for (let i = 0; i < perConn; i++) {
      let ended = false;
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
      streams.push({ ended: () => ended || gone, started: () => !st.pending });
    }
  }
  return { streams, close: () => sessions.forEach((x) => x.destroy()) };
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

/** waitServing retries fn (a call on the freeze port) until it answers, at most 30 s. */
async function waitServing(fn: () => Promise<unknown>): Promise<void> {
  for (const until = Date.now() + 30_000; ;) {
    try {
      await fn();
      return;
    } catch (err) {
      if (Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
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
    let pid = supervisorPid(dirs);
    const vmmCh = createSandnodeChannel(unixAddress(socketPath(dirs.runDir, 'vmm-supervisor')));
    const epoch = (await createServiceClient(VmServiceDefinition, vmmCh, { timeoutMs: 10_000 }).listVms({})).fenceEpoch;
    const vmm = createServiceClient(VmServiceDefinition, vmmCh, { timeoutMs: 10_000, epoch: () => epoch });
    const portOf = () => createServiceClient(FreezePortServiceDefinition, createSandnodeChannel(unixAddress(sock)), { timeoutMs: 10_000, retryAttempts: 3 });
    let port = portOf();
    const cycle = async (arm: boolean) => {
      if (arm) await vmm.armFreeze({ vmId: id, windowMs: 0 });
      const f = await port.freezeFilesystems({ maxFreezeMs: 2000 });
      await port.thawFilesystems({ freezeToken: f.freezeToken });
    };
    await cycle(true); // the node's first freeze starts the watchdog: not counted

    // CPU of freeze/thaw cycles
    const cycles = num('BENCH_FREEZE_CYCLES', 200);
    const wd = JSON.parse(readFileSync(path.join(dirs.runDir, 'freeze-watchdog', 'watchdog.json'), 'utf8')) as { pid: number };
    const c0 = cpuMs(pid) + cpuMs(wd.pid);
    for (let i = 0; i < cycles; i++) await cycle(true);
    const cpu = cpuMs(pid) + cpuMs(wd.pid) - c0;
    const spawns = await countSpawns(pid, async () => {
      for (let i = 0; i < 20; i++) await cycle(true);
    });

    // memory under 120 abusive streams (after the cycles: a bigger process costs more per process start)
    const n = num('BENCH_FREEZE_STREAMS', 120);
    const mem = await underStreams(pid, sock, n);

    // the baseline: the 0.2.0 supervisor on the same node, else its host processes replayed
    const baselineCycles = num('BENCH_FREEZE_BASELINE_CYCLES', 200);
    const build = baselineBuild();
    let base: Pick<FreezePortBench, 'baseline' | 'baselineRssBeforeMib' | 'baselineRssAfterMib' | 'baselineStreamsEnded' | 'baselineCpuMs' | 'baselineSpawnsPerCycle'>;
    if (build) {
      await stopComponent(dirs, 'vmm-supervisor');
      await startComponent(dirs, 'vmm-supervisor', { buildDir: build });
      pid = supervisorPid(dirs);
      port = portOf();
      await waitServing(() => port.getFilesystemFreeze({}));
      const b0 = cpuMs(pid);
      for (let i = 0; i < baselineCycles; i++) await cycle(false);
      const bCpu = cpuMs(pid) - b0;
      const bSpawns = await countSpawns(pid, async () => {
        for (let i = 0; i < 20; i++) await cycle(false);
      });
      const m = await underStreams(pid, sock, n);
      await stopComponent(dirs, 'vmm-supervisor');
      await startComponent(dirs, 'vmm-supervisor');
      base = {
        baseline: `0.2.0 supervisor (${path.basename(build)})`,
        baselineRssBeforeMib: m.before,
        baselineRssAfterMib: m.after,
        baselineStreamsEnded: m.ended,
        baselineCpuMs: bCpu,
        baselineSpawnsPerCycle: bSpawns === undefined ? undefined : bSpawns / 20,
      };
    } else {
      const mounts = [path.join(vmDir, 'upper-dev'), path.join(vmDir, 'workspace')];
      const b0 = cpuMs('self');
      for (let i = 0; i < baselineCycles; i++) baselineCycle(path.join(dirs.runDir, 'runc'), id, mounts);
      base = { baseline: 'replayed', baselineRssBeforeMib: undefined, baselineRssAfterMib: undefined, baselineStreamsEnded: undefined, baselineCpuMs: cpuMs('self') - b0, baselineSpawnsPerCycle: 7 };
    }

    await api.sandboxes.deleteSandbox({ sandboxId: id });
    api.close();
    vmmCh.close();
    const r: FreezePortBench = {
      streams: n,
      rssBeforeMib: mem.before,
      rssAfterMib: mem.after,
      hwmAfterMib: mem.hwm,
      streamsEnded: mem.ended,
      cycles,
      cpuMs: Math.round(cpu),
      cpuMsPerCycle: Math.round((cpu / cycles) * 100) / 100,
      ...base,
      baselineCycles,
      baselineCpuMs: Math.round(base.baselineCpuMs),
      baselineCpuMsPerCycle: Math.round((base.baselineCpuMs / baselineCycles) * 100) / 100,
      spawnsPerCycle: spawns === undefined ? undefined : spawns / 20,
    };
    const baseRss = r.baselineRssAfterMib === undefined ? 'no 0.2.0 build' : `0.2.0: ${r.baselineRssBeforeMib} -> ${r.baselineRssAfterMib} MiB`;
    rows.push([
      `freeze port: supervisor RSS before / during ${n} streams of 4 MiB partial messages`,
      `${r.rssBeforeMib} / ${r.rssAfterMib} MiB (peak ${r.hwmAfterMib})`,
      `bounded (${baseRss}, same run)`,
      `${r.streamsEnded}/${n} not held by the server${r.baselineStreamsEnded === undefined ? '' : ` (0.2.0: ${r.baselineStreamsEnded})`}`,
    ]);
    rows.push([
      `freeze port: host CPU of ${cycles} freeze/thaw cycles (armed)`,
      `${r.cpuMs} ms (${r.cpuMsPerCycle} ms/cycle)`,
      `${r.baseline}: ${r.baselineCpuMs} ms for ${baselineCycles} (${r.baselineCpuMsPerCycle} ms/cycle)`,
      `process starts/cycle ${r.spawnsPerCycle ?? 'n/a (no strace)'} (0.2.0: ${r.baselineSpawnsPerCycle ?? 'n/a'})`,
    ]);
    return r;
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
}
