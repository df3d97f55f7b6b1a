import { spawn } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { processStartTicks } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { pidFile, writePidFile, type Component, type StackDirs } from './components';
import { stopProcess } from './daemon-process';
import { sandnodeProcesses } from './purge';
import { startComponent, startStack } from './stack';

let root: string;
let dirs: StackDirs;
let buildDir: string;
const pids: number[] = [];
beforeEach(() => {
  root = mkdtempSync(path.join(tmpdir(), 'stack-'));
  dirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
  mkdirSync(dirs.runDir, { recursive: true });
  // a "build" whose server never answers GetVersion; it notes that it was started
  buildDir = path.join(root, 'build');
  mkdirSync(path.join(buildDir, 'services', 'server', 'dist'), { recursive: true });
  writeFileSync(path.join(buildDir, 'services', 'server', 'dist', 'main.js'), `require('fs').writeFileSync(${JSON.stringify(path.join(root, 'started'))}, '1'); setInterval(() => {}, 1000);`);
});
afterEach(async () => {
  for (const p of [...pids.splice(0), ...sandnodeProcesses(dirs.runDir).map((x) => x.pid)]) {
    try {
      process.kill(p, 'SIGCONT');
    } catch {
      /* gone */
    }
    await stopProcess(p, { signal: 'SIGKILL' });
  }
  rmSync(root, { recursive: true, force: true });
});

/** live starts a process that stands for a running (but silent) server and names it in the pid file. */
function liveServer(): number {
  const child = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
  pids.push(child.pid!);
  writePidFile(dirs, 'server', child.pid!);
  return child.pid!;
}

describe('startComponent', () => {
  it('never starts a second process when the pid file names a live one that does not answer', async () => {
    const pid = liveServer();
    await waitFor('the process to run', () => processStartTicks(pid) !== undefined, 5000);
    process.kill(pid, 'SIGSTOP');
    await waitFor('it to stop', () => readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') T '), 5000);
    const before = readFileSync(pidFile(dirs, 'server'), 'utf8');
    const t0 = Date.now();
    await expect(startComponent(dirs, 'server', { buildDir, timeoutMs: 300 })).rejects.toThrow(
      new RegExp(`^server pid ${pid} is running but does not answer within 300 ms \\(state T: stopped\\?.*kill it or wait`),
    );
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
    expect(readFileSync(pidFile(dirs, 'server'), 'utf8')).toBe(before);
    expect(existsSync(path.join(root, 'started'))).toBe(false);
    expect(sandnodeProcesses(dirs.runDir)).toEqual([]);
  });

  it('kills a component it started that does not answer in time and removes its pid file', async () => {
    await expect(startComponent(dirs, 'server', { buildDir, timeoutMs: 300 })).rejects.toThrow(/^server did not answer within 300 ms and was killed; see /);
    expect(existsSync(path.join(root, 'started'))).toBe(true);
    expect(existsSync(pidFile(dirs, 'server'))).toBe(false);
    expect(sandnodeProcesses(dirs.runDir)).toEqual([]);
  });

  it('starts a new one when the pid file names a process that is gone', async () => {
    writeFileSync(pidFile(dirs, 'server'), '999999999 1\n');
    await expect(startComponent(dirs, 'server', { buildDir, timeoutMs: 300 })).rejects.toThrow(/did not answer/);
    expect(existsSync(path.join(root, 'started'))).toBe(true);
  });
});

describe('startStack', () => {
  /** ops that record what was started and stopped; `fail` throws, `before` ran before the call. */
  function fakeOps(fail: Component, before: Component[]) {
    const log: string[] = [];
    const pid: Record<Component, number> = { 'vmm-supervisor': 11, 'ublk-manager': 22, server: 33 };
    return {
      log,
      ops: {
        start: async (c: Component) => {
          log.push(`start ${c}`);
          if (c === fail) throw new Error(`${c} exploded`);
          return { pid: pid[c], started: !before.includes(c) };
        },
        stop: async (c: Component, _pid: number) => {
          log.push(`stop ${c}`);
          return true;
        },
      },
    };
  }

  it('stops what this call started, in reverse order, when a later component fails', async () => {
    const f = fakeOps('server', []);
    await expect(startStack(dirs, {}, f.ops)).rejects.toThrow(/^server exploded\nup undone: stopped ublk-manager pid 22; stopped vmm-supervisor pid 11$/);
    expect(f.log).toEqual(['start vmm-supervisor', 'start ublk-manager', 'start server', 'stop ublk-manager', 'stop vmm-supervisor']);
  });

  it('leaves alone what ran before the call and says so', async () => {
    const f = fakeOps('server', ['vmm-supervisor']);
    await expect(startStack(dirs, {}, f.ops)).rejects.toThrow(/^server exploded\nup undone: stopped ublk-manager pid 22\nleft running \(they ran before this up\): vmm-supervisor pid 11$/);
    expect(f.log).toEqual(['start vmm-supervisor', 'start ublk-manager', 'start server', 'stop ublk-manager']);
  });

  it('leaves alone a component this call started whose pid file names another process since', async () => {
    const f = fakeOps('server', []);
    f.ops.stop = async (c: Component, pid: number) => {
      f.log.push(`stop ${c} ${pid}`);
      return c !== 'vmm-supervisor';
    };
    await expect(startStack(dirs, {}, f.ops)).rejects.toThrow(/^server exploded\nup undone: stopped ublk-manager pid 22; vmm-supervisor pid 11 had already exited or been replaced: left alone$/);
    expect(f.log).toEqual(['start vmm-supervisor', 'start ublk-manager', 'start server', 'stop ublk-manager 22', 'stop vmm-supervisor 11']);
  });

  it('returns every component when all start', async () => {
    const f = fakeOps('server' as Component, []);
    f.ops.start = async (c: Component) => ({ pid: 1, started: c !== 'server' });
    const r = await startStack(dirs, {}, f.ops);
    expect(r.map((x) => [x.name, x.started])).toEqual([
      ['vmm-supervisor', true],
      ['ublk-manager', true],
      ['server', false],
    ]);
  });
});

(process.getuid?.() === 0 ? test : test.skip)('startComponent refuses a runDir another user owns before it reads or writes anything there (ConfigError naming it)', async () => {
  chownSync(dirs.runDir, 65534, 65534);
  await expect(startComponent(dirs, 'server', { buildDir, timeoutMs: 2000 })).rejects.toThrow(/key "runDir": .*\/run is not owned by root \(owner uid 65534/);
  expect(readdirSync(dirs.runDir)).toEqual([]);
  expect(existsSync(path.join(root, 'started'))).toBe(false);
});
