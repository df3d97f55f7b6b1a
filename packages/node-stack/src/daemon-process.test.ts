import fs, { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { processStartTicks, processState } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { spawnDaemon, stopProcess, tail, waitForDaemon, type SpawnedDaemon } from './daemon-process';

let dir: string;
const started: SpawnedDaemon[] = [];
beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'daemon-process-'));
});
afterEach(async () => {
  for (const d of started.splice(0)) await stopProcess(d.pid, { signal: 'SIGKILL' });
  rmSync(dir, { recursive: true, force: true });
});

/** daemon starts a node script (its body) as a daemon logging to dir/name.log. */
function daemon(name: string, body: string): SpawnedDaemon {
  const script = path.join(dir, `${name}.js`);
  writeFileSync(script, body);
  const d = spawnDaemon({ script, env: process.env, logPath: path.join(dir, 'logs', `${name}.log`) });
  started.push(d);
  return d;
}

const gone = (pid: number, ticks: number | undefined) => processStartTicks(pid) !== ticks || processState(pid) === 'Z';
const logHas = (d: SpawnedDaemon, s: string) => (readFileSync(d.logPath).subarray(d.logStart).toString().includes(s) ? true : undefined);
const errors = { onExit: (c: number | string) => new Error(`exited ${c}`), onTimeout: () => new Error('timed out') };

describe('spawnDaemon + waitForDaemon', () => {
  it('the log is 0600 in a 0700 dir, also when an older release left it world-readable', async () => {
    const logs = path.join(dir, 'logs');
    mkdirSync(logs);
    writeFileSync(path.join(logs, 'p.log'), 'old\n', { mode: 0o644 });
    chmodSync(path.join(logs, 'p.log'), 0o644);
    const d = daemon('p', 'console.log("up"); setInterval(() => {}, 1000);');
    await waitForDaemon(d, () => logHas(d, 'up'), { timeoutMs: 10_000, ...errors });
    expect(statSync(d.logPath).mode & 0o777).toBe(0o600);
    const fresh = daemon('q', 'setInterval(() => {}, 1000);');
    expect(statSync(fresh.logPath).mode & 0o777).toBe(0o600);
  });

  it('a missing run dir and the dirs above it get the default mode (the user namespace root must pass them), only the logs dir 0700', () => {
    const runDir = path.join(dir, '.sandnode', 'run');
    const script = path.join(dir, 'r.js');
    writeFileSync(script, 'setInterval(() => {}, 1000);');
    const prev = process.umask(0o022);
    try {
      started.push(spawnDaemon({ script, env: process.env, logPath: path.join(runDir, 'logs', 'r.log') }));
    } finally {
      process.umask(prev);
    }
    expect([path.join(dir, '.sandnode'), runDir, path.join(runDir, 'logs')].map((d) => (statSync(d).mode & 0o777).toString(8))).toEqual(['755', '755', '700']);
  });

  it('returns what ready() found; the daemon keeps running detached, its output in its own part of the log', async () => {
    writeFileSync(path.join(dir, 'old.log'), '');
    const first = daemon('d', 'console.log("ready one"); setInterval(() => {}, 1000);');
    await waitForDaemon(first, () => logHas(first, 'ready one'), { timeoutMs: 10_000, ...errors });
    await stopProcess(first.pid);
    const second = daemon('d', 'console.log("ready two"); setInterval(() => {}, 1000);');
    expect(second.logStart).toBeGreaterThan(0);
    await expect(waitForDaemon(second, () => logHas(second, 'ready one'), { timeoutMs: 300, ...errors })).rejects.toThrow('timed out');
    expect(await waitForDaemon(second, () => logHas(second, 'ready two'), { timeoutMs: 10_000, ...errors })).toBe(true);
    expect(second.exited()).toBeUndefined();
  });

  it('throws onExit with the exit code when the daemon exits without being ready', async () => {
    const d = daemon('dies', 'console.error("boom"); process.exit(3);');
    await expect(waitForDaemon(d, () => undefined, { timeoutMs: 10_000, ...errors })).rejects.toThrow('exited 3');
    expect(tail(d.logPath)).toBe('boom');
  });

  it('counts a daemon that said it was ready and then exited as ready', async () => {
    const d = daemon('says-then-exits', 'console.log("{\\"takeover\\":false}"); process.exit(1);');
    await waitFor('the daemon to exit', () => d.exited() !== undefined, 10_000, 10);
    expect(await waitForDaemon(d, () => logHas(d, 'takeover'), { timeoutMs: 10_000, ...errors })).toBe(true);
  });

  it('kills a daemon that does not get ready in time when killOnTimeout', async () => {
    const d = daemon('hangs', 'setInterval(() => {}, 1000);');
    await waitForDaemon(d, () => (processStartTicks(d.pid) !== undefined ? true : undefined), { timeoutMs: 5000, ...errors });
    const ticks = processStartTicks(d.pid);
    await expect(waitForDaemon(d, () => undefined, { timeoutMs: 100, killOnTimeout: true, ...errors })).rejects.toThrow('timed out');
    expect(gone(d.pid, ticks)).toBe(true);
  });
});

describe('stopProcess', () => {
  const stubborn = 'process.on("SIGTERM", () => {}); console.log("up"); setInterval(() => {}, 1000);';

  it('is false for a pid that runs nothing', async () => {
    expect(await stopProcess(0)).toBe(false);
    expect(await stopProcess(2 ** 22 + 1)).toBe(false);
  });

  it('gives up on a process that ignores SIGTERM unless told to SIGKILL it', async () => {
    const d = daemon('stubborn', stubborn);
    await waitForDaemon(d, () => logHas(d, 'up'), { timeoutMs: 10_000, ...errors });
    const ticks = processStartTicks(d.pid);
    expect(await stopProcess(d.pid, { timeoutMs: 200 })).toBe(false);
    expect(gone(d.pid, ticks)).toBe(false);
    expect(await stopProcess(d.pid, { timeoutMs: 200, killAfterTimeout: true })).toBe(true);
    expect(gone(d.pid, ticks)).toBe(true);
  });

  it('a /proc read that fails with EMFILE is no exit: a daemon that ignores SIGTERM is not reported stopped', async () => {
    const d = daemon('stubborn-emfile', stubborn);
    await waitForDaemon(d, () => logHas(d, 'up'), { timeoutMs: 10_000, ...errors });
    const ticks = processStartTicks(d.pid);
    const real = fs.readFileSync;
    let calls = 0;
    const spy = jest.spyOn(fs, 'readFileSync').mockImplementation(((f: fs.PathOrFileDescriptor, o?: unknown) => {
      // the first read (its start ticks) works; then the caller is out of descriptors
      if (f === `/proc/${d.pid}/stat` && calls++ > 0) throw Object.assign(new Error('EMFILE: too many open files'), { code: 'EMFILE' });
      return (real as (f: fs.PathOrFileDescriptor, o?: unknown) => string | Buffer)(f, o);
    }) as typeof fs.readFileSync);
    try {
      expect(await stopProcess(d.pid, { timeoutMs: 200 })).toBe(false);
    } finally {
      spy.mockRestore();
    }
    expect(gone(d.pid, ticks)).toBe(false);
  });
});
