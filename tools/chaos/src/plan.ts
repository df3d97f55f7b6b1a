/**
 * The chaos plan: the whole list of actions of a run, drawn from one seeded PRNG (pure-rand's
 * xoroshiro128+) before the node starts, so that a seed names one sequence of actions and a
 * failing seed reproduces it. An action names what to do and carries the random choices it
 * needs (`pick` chooses among the sandboxes that exist when it runs, sizes, the component to
 * kill and when, the failpoint of a handover); the runner resolves `pick` against the node's
 * state, which the same actions make the same.
 */
import prand from 'pure-rand';
import type { Component } from '@sandnode/node-stack';

/** What an action does. */
export type ActionKind = 'create' | 'exec' | 'fork' | 'pause' | 'resume' | 'delete' | 'upgrade-server' | 'upgrade-ublk';

/** Where in a handover a failpoint stops a process (`<service>:<failpoint name>`), and which side it is on. */
export interface HandoverFailpoint {
  /** the service whose env var carries it */
  service: 'server' | 'ublk-manager';
  /** the failpoint name as the service knows it (services/server handover/failpoints.ts, services/ublk-manager core/failpoints.ts) */
  name: string;
  /** old: reached by the process that hands over (armed on it by a clean handover first); new: by the one that takes over */
  side: 'old' | 'new';
}

/** The failpoints of the server handover (in the order they are reached), each with action kill. */
export const SERVER_HANDOVER_FAILPOINTS: readonly HandoverFailpoint[] = [
  { service: 'server', name: 'handover.after-hold', side: 'old' },
  { service: 'server', name: 'handover.after-send', side: 'old' },
  { service: 'server', name: 'handover.after-release', side: 'old' },
  { service: 'server', name: 'takeover.after-fds', side: 'new' },
  { service: 'server', name: 'takeover.after-lease', side: 'new' },
  { service: 'server', name: 'takeover.after-serve', side: 'new' },
];

/** The failpoints of the device handover (ublk-manager HandoverAll), each with action kill. */
export const UBLK_HANDOVER_FAILPOINTS: readonly HandoverFailpoint[] = [
  { service: 'ublk-manager', name: 'ublk.quiesce.after', side: 'old' },
  { service: 'ublk-manager', name: 'ublk.release.after', side: 'old' },
  { service: 'ublk-manager', name: 'ublk.handover-all.after-list', side: 'new' },
  { service: 'ublk-manager', name: 'ublk.handover.after-release', side: 'new' },
  { service: 'ublk-manager', name: 'ublk.recover', side: 'new' },
  { service: 'ublk-manager', name: 'ublk.recover.before-response', side: 'new' },
  { service: 'ublk-manager', name: 'ublk.handover-all.after-first-move', side: 'new' },
];

/** A kill -9 of a component at a random point of an action. */
export interface PlannedKill {
  component: Component;
  /** time after the action started, ms */
  delayMs: number;
}

/** One step of the plan. */
export interface Action {
  /** 1-based step number */
  step: number;
  kind: ActionKind;
  /** chooses the target among the sandboxes that exist when the action runs (index modulo their count) */
  pick: number;
  /** exec: bytes the command writes to stdout (stdin: bytes sent and echoed back) */
  bytes: number;
  /** exec: send `bytes` on stdin, written to /workspace and read back (true), or let `head -c` write them (false) */
  stdin: boolean;
  /** seed of the exec's payload (its bytes are derived from it) */
  payloadSeed: number;
  /** handovers: the failpoint that kills a process at that step (undefined: a clean handover) */
  failpoint?: HandoverFailpoint;
  /** kill -9 of a component while the action runs (undefined: none) */
  kill?: PlannedKill;
}

/** Relative weight of each kind in a plan. */
const WEIGHTS: readonly [ActionKind, number][] = [
  ['create', 16],
  ['exec', 24],
  ['fork', 8],
  ['pause', 8],
  ['resume', 8],
  ['delete', 10],
  ['upgrade-server', 9],
  ['upgrade-ublk', 7],
];
/** Probability (in %) that a workload action gets a kill -9 of a random component. */
const KILL_PCT = 15;
/** Probability (in %) that a handover gets a failpoint; else a kill at a random delay with KILL_PCT. */
const FAILPOINT_PCT = 50;
/** Longest delay of a planned kill after its action started, ms. */
const MAX_KILL_DELAY_MS = 600;
/** exec sizes: up to this many bytes (1 MiB). */
const MAX_EXEC_BYTES = 1 << 20;
/** The components a kill chooses from. */
const KILLABLE: readonly Component[] = ['vmm-supervisor', 'ublk-manager', 'server'];

/** A seeded source of integers (pure-rand xoroshiro128+, mutated in place). */
export class Prng {
  private readonly rng: prand.RandomGenerator;

  constructor(seed: number) {
    this.rng = prand.xoroshiro128plus(seed | 0);
  }

  /** int is a uniform integer in [min, max] (both included). */
  int(min: number, max: number): number {
    return prand.unsafeUniformIntDistribution(min, max, this.rng);
  }

  /** pct is true with probability p percent. */
  pct(p: number): boolean {
    return this.int(0, 99) < p;
  }

  /** of is a uniform element of xs (non-empty). */
  of<T>(xs: readonly T[]): T {
    return xs[this.int(0, xs.length - 1)] as T;
  }
}

/**
 * planActions draws the plan of a run: `steps` actions from seed (any 32-bit integer). Pure:
 * the same seed and steps give the same list, and a longer run of a seed starts with the
 * shorter run's actions.
 */
export function planActions(seed: number, steps: number): Action[] {
  const r = new Prng(seed);
  const total = WEIGHTS.reduce((s, [, w]) => s + w, 0);
  const out: Action[] = [];
  for (let step = 1; step <= steps; step++) {
    // every step draws the same number of values, whatever its kind, so step n does not depend on the kinds before it
    let x = r.int(0, total - 1);
    let kind: ActionKind = 'create';
    for (const [k, w] of WEIGHTS) {
      if (x < w) {
        kind = k;
        break;
      }
      x -= w;
    }
    const pick = r.int(0, 1 << 20);
    const bytes = r.int(1, MAX_EXEC_BYTES);
    const stdin = r.pct(50);
    const payloadSeed = r.int(0, 0x7fffffff);
    const useFailpoint = r.pct(FAILPOINT_PCT);
    const serverFp = r.of(SERVER_HANDOVER_FAILPOINTS);
    const ublkFp = r.of(UBLK_HANDOVER_FAILPOINTS);
    const killNow = r.pct(KILL_PCT);
    const kill: PlannedKill = { component: r.of(KILLABLE), delayMs: r.int(0, MAX_KILL_DELAY_MS) };
    const a: Action = { step, kind, pick, bytes, stdin, payloadSeed };
    if (kind === 'upgrade-server' && useFailpoint) a.failpoint = serverFp;
    else if (kind === 'upgrade-ublk' && useFailpoint) a.failpoint = ublkFp;
    else if (killNow) a.kill = kill;
    out.push(a);
  }
  return out;
}

/** describeAction is one line naming an action and its random choices ("12 exec pick=3 bytes=1024 stdin kill ublk-manager@120ms"). */
export function describeAction(a: Action): string {
  const parts = [`${a.step}`, a.kind, `pick=${a.pick}`];
  if (a.kind === 'exec') parts.push(`bytes=${a.bytes}`, a.stdin ? 'stdin' : 'stdout');
  if (a.failpoint) parts.push(`failpoint ${a.failpoint.service}:${a.failpoint.name} (${a.failpoint.side})`);
  if (a.kill) parts.push(`kill -9 ${a.kill.component}@${a.kill.delayMs}ms`);
  return parts.join(' ');
}

/**
 * payload is the exec's deterministic content: `bytes` bytes from payloadSeed (the same seed
 * gives the same bytes, so a failing run shows the same stream).
 */
export function payload(payloadSeed: number, bytes: number): Buffer {
  const r = prand.xoroshiro128plus(payloadSeed);
  const out = Buffer.allocUnsafe(bytes);
  for (let i = 0; i < bytes; i += 4) {
    const v = prand.unsafeUniformIntDistribution(0, 0xffffffff, r);
    for (let j = 0; j < 4 && i + j < bytes; j++) out[i + j] = (v >>> (8 * j)) & 0xff;
  }
  return out;
}
