import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { writePidFile } from '@sandnode/node-stack';
import { processState } from '@sandnode/shared';
import { useTempDir, waitFor } from '@sandnode/testkit';
import { componentPid, pidText } from './component-pid';

describe('componentPid', () => {
  const tmp = useTempDir('cli-pid');
  const dirs = () => ({ stateDir: `${tmp()}/state`, runDir: tmp(), listen: '' });

  it('a component that answered: its pid', () => {
    expect(componentPid(dirs(), 'ublk-manager', 4242)).toEqual({ pid: 4242 });
  });

  it('a pid file of a live process: its pid', () => {
    writePidFile(dirs(), 'ublk-manager', process.pid);
    expect(componentPid(dirs(), 'ublk-manager', undefined)).toEqual({ pid: process.pid });
  });

  it('a pid file of a process that is gone: no pid, "stale pid file"', async () => {
    const child = spawn('true');
    const pid = child.pid!;
    await new Promise((r) => child.once('exit', r));
    writeFileSync(`${tmp()}/ublk-manager.pid`, `${pid} 12345\n`);
    const p = componentPid(dirs(), 'ublk-manager', undefined);
    expect(p).toEqual({ pid: null, stalePid: pid });
    expect(pidText(p)).toBe(`- (stale pid file: ${pid})`);
  });

  it('a pid file of a zombie (exited, not reaped by its parent): no pid, "stale pid file"', async () => {
    // sh starts `sleep 1` in the background and becomes `sleep 30` (before the 1 s is up), which never reaps it
    const parent = spawn('sh', ['-c', 'sleep 1 & echo $!; exec sleep 30'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      const pid = Number(await new Promise<string>((r) => parent.stdout.once('data', (b: Buffer) => r(b.toString()))));
      await waitFor('the background sleep to be a zombie', () => processState(pid) === 'Z');
      writePidFile(dirs(), 'ublk-manager', pid);
      expect(componentPid(dirs(), 'ublk-manager', undefined)).toEqual({ pid: null, stalePid: pid });
    } finally {
      parent.kill('SIGKILL');
      await new Promise((r) => parent.once('exit', r));
    }
  });

  it('no pid file: "-"', () => {
    expect(pidText(componentPid(dirs(), 'server', undefined))).toBe('-');
  });
});
