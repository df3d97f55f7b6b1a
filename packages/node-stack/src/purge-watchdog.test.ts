/**
 * down --purge stops the node's freeze watchdog (a process that outlives the supervisor by
 * design) instead of leaving it until it notices its dir is gone; it never signals a process the
 * pid file names that is not that watchdog.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { processStartTicks } from '@sandnode/shared';
import { useTempDir, waitFor } from '@sandnode/testkit';
import { liveWatchdog, purgeNode, watchdogOf } from './purge';

describe('purgeNode and the freeze watchdog', () => {
  const tmp = useTempDir('purge-watchdog');
  const children: ChildProcess[] = [];
  afterEach(() => {
    for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  });

  /** start runs a long-lived node process of script (a file named name in the temp dir) and writes the watchdog pid file for it. */
  async function start(name: string, ticks?: number): Promise<{ child: ChildProcess; runDir: string; exited: Promise<unknown> }> {
    const runDir = path.join(tmp(), 'run');
    mkdirSync(path.join(runDir, 'freeze-watchdog'), { recursive: true });
    const script = path.join(tmp(), name);
    writeFileSync(script, 'setInterval(() => {}, 1000);\n');
    const child = spawn(process.execPath, [script], { stdio: 'ignore' });
    children.push(child);
    const exited = new Promise((r) => child.once('exit', r));
    const startTicks = await waitFor('the child to run', () => processStartTicks(child.pid!));
    writeFileSync(path.join(runDir, 'freeze-watchdog', 'watchdog.json'), JSON.stringify({ schema: 1, pid: child.pid, startTicks: ticks ?? startTicks }));
    return { child, runDir, exited };
  }

  it('SIGTERMs the watchdog its pid file names, waits for it to exit and reports it', async () => {
    const { child, runDir, exited } = await start('freeze-watchdog-main.js');
    expect(liveWatchdog(runDir)).toBe(child.pid);
    const report = await purgeNode({ runDir, stateDir: path.join(tmp(), 'state'), listen: '' });
    expect(report.watchdogPid).toBe(child.pid);
    await exited;
    expect(child.signalCode).toBe('SIGTERM');
    expect(report.dirs).toContain(runDir);
  });

  it('leaves a process that is not the watchdog (other command line, or another start time) alone', async () => {
    const other = await start('something-else.js');
    expect(liveWatchdog(other.runDir)).toBeUndefined();
    expect((await purgeNode({ runDir: other.runDir, stateDir: path.join(tmp(), 'state'), listen: '' })).watchdogPid).toBeUndefined();
    expect(other.child.exitCode === null && other.child.signalCode === null).toBe(true);
    const reused = await start('freeze-watchdog-main.js', 1);
    expect(liveWatchdog(reused.runDir)).toBeUndefined();
  });

  it('keeps the run dir and signals nothing when /proc cannot say whether the watchdog runs (EMFILE)', async () => {
    const { child, runDir } = await start('freeze-watchdog-main.js');
    const unknown = () => 'unknown' as const;
    expect(watchdogOf(runDir, unknown)).toEqual({ pid: child.pid, liveness: 'unknown' });
    const report = await purgeNode({ runDir, stateDir: path.join(tmp(), 'state'), listen: '' }, unknown);
    expect(report.watchdogPid).toBeUndefined();
    expect(report.dirs).not.toContain(runDir);
    expect(report.kept).toEqual([expect.objectContaining({ path: runDir, why: expect.stringContaining(`pid ${child.pid}`) })]);
    expect(existsSync(path.join(runDir, 'freeze-watchdog', 'watchdog.json'))).toBe(true);
    expect(child.exitCode === null && child.signalCode === null).toBe(true);
  });
});
