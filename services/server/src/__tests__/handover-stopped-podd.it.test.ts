/**
 * A sandbox that stops its own podd (SIGSTOP: podd's socket still accepts, Health never answers)
 * does not lengthen a server handover (attacker finding, issue 11: every handover's hold grew by
 * the adoption's 2 s podd timeout). The new server adopts without asking podds and asks them
 * after the switch: its "podd did not answer Health" for that sandbox comes after its "active"
 * line, the sandbox stays RUNNING, and once podd runs again its calls work.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { upgradeServer } from '@sandnode/node-stack';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, execCollect, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

/** descendants of pid (host pids), from /proc's ppid fields */
function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  for (const p of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    try {
      const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
      parent.set(Number(p), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      /* gone */
    }
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [c, pp] of parent) {
      if (pp !== p) continue;
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

const cmdline = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return '';
  }
};

/** the pino lines of pid in the node's server logs, in order */
function serverLines(runDir: string, pid: number): { msg?: string; sandbox_id?: string }[] {
  const dir = path.join(runDir, 'logs');
  const out: { msg?: string; sandbox_id?: string; pid?: number }[] = [];
  for (const f of readdirSync(dir).filter((n) => /^server(-[ab])?\.log$/.test(n)))
    for (const line of readFileSync(path.join(dir, f), 'utf8').split('\n')) {
      if (!line.startsWith('{"level"')) continue;
      try {
        out.push(JSON.parse(line) as { msg?: string; pid?: number });
      } catch {
        /* cut line */
      }
    }
  return out.filter((l) => l.pid === pid);
}

describeNode('a sandbox that stops its podd, through a server handover', () => {
  let node: TestNode;
  let stopped: number[] = [];
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    for (const p of stopped) process.kill(p, 'SIGCONT');
    await node?.stop();
  });

  it('adopts without waiting for it, says so after the switch, and the sandbox stays RUNNING', async () => {
    const s = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const podds = descendants(s.pid).filter((p) => /podd/.test(cmdline(p)));
    expect(podds.length).toBeGreaterThan(0);
    for (const p of podds) process.kill(p, 'SIGSTOP');
    stopped = podds;
    const oldPid = serverProcesses(node.dirs.runDir)[0]!;
    const result = await upgradeServer(node.dirs, '.', 90_000);
    expect(result.newPid).not.toBe(oldPid);
    const warned = await waitFor(
      'the new server to report the stopped podd',
      () => {
        const lines = serverLines(node.dirs.runDir, result.newPid);
        const active = lines.findIndex((l) => l.msg === 'active');
        const podd = lines.findIndex((l) => l.msg === 'podd did not answer Health; sandbox kept RUNNING' && l.sandbox_id === s.sandboxId);
        return podd >= 0 ? { active, podd } : undefined;
      },
      30_000,
    );
    // before: the warning came inside the adoption, before "active" (and the hold waited for it)
    expect(warned.active).toBeGreaterThanOrEqual(0);
    expect(warned.podd).toBeGreaterThan(warned.active);
    expect((await node.api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox?.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    for (const p of podds) process.kill(p, 'SIGCONT');
    stopped = [];
    expect((await execCollect(node.api, s.sandboxId, ['echo', 'back'])).stdout).toBe('back\n');
    await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });
});
