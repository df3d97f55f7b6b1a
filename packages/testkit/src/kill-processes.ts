/** Stopping test processes by pid, each checked against its start ticks (a pid reused meanwhile is left alone). */
import { processStartTicks } from '@sandnode/shared';

/**
 * killProcesses stops the given pids of this run (SIGTERM, SIGKILL after graceMs; 0: SIGKILL at
 * once) and waits until they are gone. Only for pids found by sandnodeProcesses(ourRunDir).
 */
export async function killProcesses(pids: number[], graceMs = 5000): Promise<void> {
  const live = pids.map((pid) => ({ pid, ticks: processStartTicks(pid) })).filter((p) => p.ticks !== undefined);
  const alive = (p: { pid: number; ticks: number | undefined }) => processStartTicks(p.pid) === p.ticks;
  const signal = (sig: NodeJS.Signals) => {
    for (const p of live.filter(alive)) {
      try {
        process.kill(p.pid, sig);
      } catch {
        /* gone */
      }
    }
  };
  signal(graceMs > 0 ? 'SIGTERM' : 'SIGKILL');
  const deadline = Date.now() + graceMs;
  while (live.some(alive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
  signal('SIGKILL');
  while (live.some(alive)) await new Promise((r) => setTimeout(r, 10));
}
