/**
 * Section `files` of `npm run bench`: `sandnode sandbox cp` of BENCH_FILES_MB MiB (default
 * 1024) into a sandbox and back out (the CLI's own MB/s: transfer time, 10^6 bytes per
 * second; and the wall time of the whole command with its start and sha256), the sha256 of
 * both directions checked against the local file. Beside them, baselines from the same run:
 * the same bytes out through `exec cat` (the Exec stream), and a raw local copy of the file
 * (read + write + fsync on the host disk). The host's load average is recorded before and
 * after: the machine is shared, so a figure is only as good as the load beside it; and the CPU
 * time the server, podd and the CLI spent per GiB, which the load does not inflate much. Each
 * copy runs twice: over the gRPC streams (SANDNODE_CP_GRPC=1, the baseline) and over the bulk
 * channel (the default on a unix socket), in the same run.
 * Goal: >= 200 MB/s each way.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, readFileSync, rmSync } from 'node:fs';
import { open } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { askVersion } from '@sandnode/shared';
import type { ServerApi, StackDirs } from '@sandnode/node-stack';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
const MiB = 1024 * 1024;
const r1 = (x: number) => Math.round(x * 10) / 10;
const mbps = (bytes: number, ms: number) => r1(bytes / 1e3 / Math.max(ms, 1));

/** What the files section measured. */
export interface FilesBench {
  bytes: number;
  /** MB/s of `sandbox cp` in (the CLI's transfer figure) and wall time of the command, ms */
  cpInMbPerSec: number;
  cpInWallMs: number;
  cpOutMbPerSec: number;
  cpOutWallMs: number;
  /** both directions' sha256 equalled the local file's */
  sha256Intact: boolean;
  /** the same bytes out through Exec (`cat`), MB/s */
  execCatOutMbPerSec: number;
  /** a raw local copy (read + write + fsync), MB/s */
  localCopyMbPerSec: number;
  /** CPU time (user + system) the server and the sandbox's podd spent per GiB moved, ms, in and out */
  serverCpuMsPerGiB: { in: number; out: number };
  poddCpuMsPerGiB: { in: number; out: number };
  /** CPU time of the `sandnode` CLI process per GiB, ms, in and out */
  cliCpuMsPerGiB: { in: number; out: number };
  /** the same copies over the gRPC streams (SANDNODE_CP_GRPC=1), in the same run before the bulk channel's: the baseline */
  grpc: {
    inMbPerSec: number;
    outMbPerSec: number;
    sha256Intact: boolean;
    serverCpuMsPerGiB: { in: number; out: number };
    poddCpuMsPerGiB: { in: number; out: number };
    cliCpuMsPerGiB: { in: number; out: number };
  };
  /** os.loadavg() (1, 5, 15 min) before and after the section, on a host of `cpus` cores */
  loadBefore: number[];
  loadAfter: number[];
  cpus: number;
  goalMbPerSec: number;
}

async function writeRandom(file: string, n: number): Promise<string> {
  const h = createHash('sha256');
  const out = createWriteStream(file);
  for (let done = 0; done < n;) {
    const b = randomBytes(Math.min(4 * MiB, n - done));
    h.update(b);
    if (!out.write(b)) await new Promise<void>((r) => out.once('drain', () => r()));
    done += b.length;
  }
  await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
  return h.digest('hex');
}

/** cli runs `sandnode` against dirs and returns its parsed --json output and wall time. */
async function cli(dirs: StackDirs, args: string[], grpc = false): Promise<{ out: { mbPerSec: number; sha256: string; bytes: number }; wallMs: number; cliCpuMs: number }> {
  const t0 = performance.now();
  // through sh so that its `times` reports the CLI's CPU time (user + system of its children) on stderr
  const argv = [process.execPath, require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', dirs.stateDir, '--run-dir', dirs.runDir, ...args, '--json'];
  const p = spawn('/bin/sh', ['-c', '"$@"; s=$?; times >&2; exit $s', 'sh', ...argv], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, SANDNODE_CP_GRPC: grpc ? '1' : '0' },
  });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const status = await new Promise((r) => p.on('close', r));
  if (status !== 0) throw new Error(`sandnode ${args.join(' ')}: exit ${String(status)}: ${stderr.slice(0, 300)}`);
  // the second line of `times`: the children's user and system time, "0m1.230000s 0m0.450000s"
  const t = /(\d+)m([\d.]+)s (\d+)m([\d.]+)s\s*$/.exec(stderr.trim());
  const cliCpuMs = t ? Math.round((Number(t[1]) * 60 + Number(t[2]) + Number(t[3]) * 60 + Number(t[4])) * 1000) : 0;
  return { out: JSON.parse(stdout) as { mbPerSec: number; sha256: string; bytes: number }, wallMs: performance.now() - t0, cliCpuMs };
}

/** cpuMs is the user + system CPU time of pid from /proc, ms (clock ticks of 10 ms); 0 when it cannot be read. */
function cpuMs(pid: number): number {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
    return (Number(f[11]) + Number(f[12])) * 10;
  } catch {
    return 0;
  }
}

/** poddPid finds the podd among the children of the sandbox's init (host pid); 0 when not found. */
function poddPid(initPid: number): number {
  try {
    for (const c of readFileSync(`/proc/${initPid}/task/${initPid}/children`, 'utf8').trim().split(/\s+/)) {
      if (c && readFileSync(`/proc/${c}/cmdline`, 'utf8').includes('podd')) return Number(c);
    }
  } catch {
    /* not found */
  }
  return 0;
}

async function localCopy(src: string, dst: string): Promise<number> {
  const t0 = performance.now();
  const fh = await open(dst, 'w');
  try {
    let pos = 0;
    for await (const c of createReadStream(src, { highWaterMark: MiB })) {
      const b = c as Buffer;
      await fh.write(b, 0, b.length, pos);
      pos += b.length;
    }
    await fh.sync();
  } finally {
    await fh.close();
  }
  return performance.now() - t0;
}

/** benchFiles copies into a sandbox of its own (a /workspace of twice the size) of the node at dirs and back; rows get the table line. */
export async function benchFiles(api: ServerApi, dirs: StackDirs, rows: (string | number)[][]): Promise<FilesBench> {
  const bytes = Math.max(1, num('BENCH_FILES_MB', 1024)) * MiB;
  const sb = (await api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 0, memoryMib: 0, diskBytes: 2 * bytes + 256 * MiB, pids: 0 } })).sandbox!;
  const id = sb.sandboxId;
  const serverPid = (await askVersion(`unix://${dirs.runDir}/server.sock`)).pid;
  const podd = poddPid(sb.pid);
  const perGiB = (ms: number) => Math.round((ms * 1024 * MiB) / bytes);
  const dir = path.join(dirs.stateDir, '..', 'bench-files');
  const src = path.join(dir, 'in.bin');
  const back = path.join(dir, 'out.bin');
  const loadBefore = os.loadavg().map(r1);
  try {
    await open(dir, 'r')
      .then((f) => f.close())
      .catch(async () => (await import('node:fs/promises')).mkdir(dir, { recursive: true }));
    const sha = await writeRandom(src, bytes);
    const local = await localCopy(src, path.join(dir, 'local.bin'));
    rmSync(path.join(dir, 'local.bin'));
    // the gRPC streams first (SANDNODE_CP_GRPC=1), as the baseline of the same run
    const g0 = [cpuMs(serverPid), cpuMs(podd)];
    const gUp = await cli(dirs, ['sandbox', 'cp', src, `${id}:/workspace/bench-files-grpc.bin`], true);
    const g1 = [cpuMs(serverPid), cpuMs(podd)];
    const gDown = await cli(dirs, ['sandbox', 'cp', `${id}:/workspace/bench-files-grpc.bin`, back], true);
    const g2 = [cpuMs(serverPid), cpuMs(podd)];
    const grpcIntact = gUp.out.sha256 === sha && gDown.out.sha256 === sha;
    rmSync(back, { force: true });
    for await (const ev of api.sandboxes.exec({ sandboxId: id, argv: ['rm', '-f', '/workspace/bench-files-grpc.bin'] })) void ev;
    const c0 = [cpuMs(serverPid), cpuMs(podd)];
    const up = await cli(dirs, ['sandbox', 'cp', src, `${id}:/workspace/bench-files.bin`]);
    const c1 = [cpuMs(serverPid), cpuMs(podd)];
    const down = await cli(dirs, ['sandbox', 'cp', `${id}:/workspace/bench-files.bin`, back]);
    const c2 = [cpuMs(serverPid), cpuMs(podd)];
    const t0 = performance.now();
    let catBytes = 0;
    for await (const ev of api.sandboxes.exec({ sandboxId: id, argv: ['cat', '/workspace/bench-files.bin'] })) if (ev.event?.$case === 'stdout') catBytes += ev.event.value.length;
    const catMs = performance.now() - t0;
    if (catBytes !== bytes) throw new Error(`exec cat gave ${catBytes} bytes of ${bytes}`);
    const r: FilesBench = {
      bytes,
      cpInMbPerSec: up.out.mbPerSec,
      cpInWallMs: Math.round(up.wallMs),
      cpOutMbPerSec: down.out.mbPerSec,
      cpOutWallMs: Math.round(down.wallMs),
      sha256Intact: up.out.sha256 === sha && down.out.sha256 === sha && up.out.bytes === bytes && down.out.bytes === bytes,
      execCatOutMbPerSec: mbps(bytes, catMs),
      localCopyMbPerSec: mbps(bytes, local),
      serverCpuMsPerGiB: { in: perGiB((c1[0] ?? 0) - (c0[0] ?? 0)), out: perGiB((c2[0] ?? 0) - (c1[0] ?? 0)) },
      poddCpuMsPerGiB: { in: perGiB((c1[1] ?? 0) - (c0[1] ?? 0)), out: perGiB((c2[1] ?? 0) - (c1[1] ?? 0)) },
      cliCpuMsPerGiB: { in: perGiB(up.cliCpuMs), out: perGiB(down.cliCpuMs) },
      grpc: {
        inMbPerSec: gUp.out.mbPerSec,
        outMbPerSec: gDown.out.mbPerSec,
        sha256Intact: grpcIntact,
        serverCpuMsPerGiB: { in: perGiB((g1[0] ?? 0) - (g0[0] ?? 0)), out: perGiB((g2[0] ?? 0) - (g1[0] ?? 0)) },
        poddCpuMsPerGiB: { in: perGiB((g1[1] ?? 0) - (g0[1] ?? 0)), out: perGiB((g2[1] ?? 0) - (g1[1] ?? 0)) },
        cliCpuMsPerGiB: { in: perGiB(gUp.cliCpuMs), out: perGiB(gDown.cliCpuMs) },
      },
      loadBefore,
      loadAfter: os.loadavg().map(r1),
      cpus: os.cpus().length,
      goalMbPerSec: 200,
    };
    rows.push([
      `files: sandbox cp ${bytes / MiB} MiB in / out`,
      `${r.cpInMbPerSec} / ${r.cpOutMbPerSec} MB/s (sha256 ${r.sha256Intact ? 'intact' : 'DIFFERENT'})`,
      '>= 200 MB/s',
      `baseline gRPC streams ${r.grpc.inMbPerSec} / ${r.grpc.outMbPerSec} MB/s (CPU ms/GiB in/out server ${r.grpc.serverCpuMsPerGiB.in}/${r.grpc.serverCpuMsPerGiB.out}, podd ${r.grpc.poddCpuMsPerGiB.in}/${r.grpc.poddCpuMsPerGiB.out}, cli ${r.grpc.cliCpuMsPerGiB.in}/${r.grpc.cliCpuMsPerGiB.out}), exec cat ${r.execCatOutMbPerSec} MB/s, local copy ${r.localCopyMbPerSec} MB/s; bulk CPU ms/GiB in/out server ${r.serverCpuMsPerGiB.in}/${r.serverCpuMsPerGiB.out}, podd ${r.poddCpuMsPerGiB.in}/${r.poddCpuMsPerGiB.out}, cli ${r.cliCpuMsPerGiB.in}/${r.cliCpuMsPerGiB.out}; load ${loadBefore.join(' ')} -> ${r.loadAfter.join(' ')} on ${r.cpus} cpus`,
    ]);
    if (!r.sha256Intact || !grpcIntact) throw new Error('sandbox cp changed the bytes (sha256 differs)');
    return r;
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await api.sandboxes.deleteSandbox({ sandboxId: id }).catch(() => undefined);
  }
}
