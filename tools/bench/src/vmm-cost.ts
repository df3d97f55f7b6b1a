/**
 * What the vmm-supervisor spends, for figures that do not depend on the host's load: the host
 * processes it started (its metric sandnode_vmm_host_commands_total, by command) and the CPU
 * time of its process tree (itself and its command helpers, each with the children it reaped:
 * runc, mount, umount), read from /proc. A bench takes one snapshot before and one after a step
 * and divides the difference by what the step did (e.g. sandboxes drained).
 */
import { readdirSync, readFileSync } from 'node:fs';

/** Clock ticks a second of /proc/<pid>/stat's CPU fields (USER_HZ: 100 on Linux). */
const TICKS_PER_S = 100;

/** A snapshot: host commands started so far by command, the tree's CPU time so far (ms; sysMs: of it in the kernel), and the server's (ms). */
export interface VmmCost {
  commands: Record<string, number>;
  cpuMs: number;
  sysMs: number;
  serverCpuMs: number;
}

/** cpuOf is pid's CPU time with its reaped children's, ms: all, and the kernel's share; 0 when it is gone. */
function cpuOf(pid: number): { all: number; sys: number } {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // fields after the command (in parentheses, which may hold spaces): state is field 3, utime 14 .. cstime 17
    const f = stat
      .slice(stat.lastIndexOf(')') + 2)
      .split(' ')
      .map(Number);
    const ms = (t: number) => (t * 1000) / TICKS_PER_S;
    return { all: ms(f[11]! + f[12]! + f[13]! + f[14]!), sys: ms(f[12]! + f[14]!) };
  } catch {
    return { all: 0, sys: 0 };
  }
}

/** childrenOf lists pid's child processes (every thread's), [] when it is gone. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  try {
    for (const t of readdirSync(`/proc/${pid}/task`)) {
      const list = readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').trim();
      if (list) out.push(...list.split(' ').map(Number));
    }
  } catch {
    /* gone */
  }
  return out;
}

/** treeCpu is the CPU time of pid and its live child processes (the command helpers), ms: all, and the kernel's share. */
export function treeCpu(pid: number): { all: number; sys: number } {
  return [pid, ...childrenOf(pid)].map(cpuOf).reduce((a, c) => ({ all: a.all + c.all, sys: a.sys + c.sys }));
}

/** parseHostCommands reads sandnode_vmm_host_commands_total's samples from a Prometheus text page. Pure. */
export function parseHostCommands(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^sandnode_vmm_host_commands_total\{command="([^"]*)"\} (\S+)$/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

/** vmmCost snapshots the supervisor of pid whose /metrics listens on metricsAddress ("host:port"), and the server of serverPid. */
export async function vmmCost(pid: number, metricsAddress: string, serverPid: number): Promise<VmmCost> {
  const res = await fetch(`http://${metricsAddress}/metrics`);
  if (!res.ok) throw new Error(`vmm-supervisor /metrics: HTTP ${res.status}`);
  const cpu = treeCpu(pid);
  return { commands: parseHostCommands(await res.text()), cpuMs: cpu.all, sysMs: cpu.sys, serverCpuMs: treeCpu(serverPid).all };
}

/** costPer is (after - before) / n: commands by command (those that rose) and their total, CPU ms (and the kernel's share), the server's CPU ms, one decimal. Pure. */
export function costPer(before: VmmCost, after: VmmCost, n: number): { processStarts: number; byCommand: Record<string, number>; cpuMs: number; sysMs: number; serverCpuMs: number } {
  const r1 = (x: number) => Math.round(x * 10) / 10;
  const byCommand: Record<string, number> = {};
  let total = 0;
  for (const [k, v] of Object.entries(after.commands)) {
    const d = v - (before.commands[k] ?? 0);
    if (d > 0) byCommand[k] = r1(d / n);
    total += d;
  }
  return {
    processStarts: r1(total / n),
    byCommand,
    cpuMs: r1((after.cpuMs - before.cpuMs) / n),
    sysMs: r1((after.sysMs - before.sysMs) / n),
    serverCpuMs: r1((after.serverCpuMs - before.serverCpuMs) / n),
  };
}
