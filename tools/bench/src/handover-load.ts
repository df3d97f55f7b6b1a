/**
 * The parent side of handover-load-main.ts: forks one load process (niced 10, fixed call rate)
 * and, when ended, returns its report. Times in the report are CLOCK_MONOTONIC ms, as
 * {@link now} here.
 */
import { fork } from 'node:child_process';
import path from 'node:path';
import type { LoadArgs, LoadReport } from './handover-load-main';

export { now } from './handover-load-main';

/** A running load process: end() stops its calls and resolves with what it saw. */
export interface LoadProcess {
  end(): Promise<LoadReport>;
}

/** startLoadProcess forks a load process with args and resolves once it is making calls. Rejects if it exits first. */
export function startLoadProcess(args: LoadArgs): Promise<LoadProcess> {
  const child = fork(path.join(__dirname, 'handover-load-main.js'), [JSON.stringify(args)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'], execArgv: [] });
  const report = new Promise<LoadReport>((resolve, reject) => {
    child.on('message', (m) => {
      if (m !== 'ready') resolve(m as LoadReport);
    });
    child.once('exit', (code) => reject(new Error(`handover load process exited (${code}) before it reported`)));
  });
  report.catch(() => undefined);
  return new Promise<LoadProcess>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`handover load process exited (${code}) while starting`)));
    child.once('message', (m) => {
      if (m === 'ready') resolve({ end: () => (child.send('stop'), report) });
    });
  });
}
