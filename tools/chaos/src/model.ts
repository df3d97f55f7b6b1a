/**
 * What the chaos run's own calls say the node must look like: one {@link Expectation} per
 * sandbox the run made, in the order it learnt of them (so that an action's `pick` chooses the
 * same sandbox in every run of a seed), plus the creates and forks that failed, whose sandbox
 * may or may not exist (they carry a request id and the metadata key {@link REQUEST_KEY}).
 */
import type { Expectation, NodeSnapshot } from './invariants';

/** The metadata key naming the request id of the create or fork that made a sandbox. */
export const REQUEST_KEY = 'chaos-request';

/** The run's view of the node's sandboxes. */
export class Model {
  /** by sandbox id, in the order the run learnt of them */
  private readonly expect = new Map<string, Expectation>();
  /** request ids of creates and forks that failed: their sandbox may appear (RUNNING or ERROR) or not */
  private readonly pending = new Set<string>();

  /** expectations lists them all (in order). */
  expectations(): Expectation[] {
    return [...this.expect.values()];
  }

  /** ids of the sandboxes expected in one of states (exactly: a sandbox whose state is not known yet is not among them). */
  inState(state: string): string[] {
    return this.expectations()
      .filter((e) => e.states.length === 1 && e.states[0] === state && !e.mayBeGone)
      .map((e) => e.id);
  }

  /** all ids (for delete: any sandbox, whatever its state). */
  ids(): string[] {
    return [...this.expect.keys()];
  }

  /** size counts the sandboxes that may exist. */
  size(): number {
    return this.expect.size + this.pending.size;
  }

  get(id: string): Expectation | undefined {
    return this.expect.get(id);
  }

  /** made: a create or fork answered with sandbox id, RUNNING with pid. */
  made(id: string, pid: number): void {
    this.expect.set(id, { id, states: ['RUNNING'], pid, mayBeGone: false });
  }

  /** failedToMake: a create or fork with requestId failed; its sandbox may exist. */
  failedToMake(requestId: string): void {
    this.pending.add(requestId);
  }

  /** now: a call answered that id is in state. */
  now(id: string, state: string): void {
    const e = this.expect.get(id);
    if (e) e.states = [state];
  }

  /** maybe: a call on id failed; it may be in any of states (or gone). */
  maybe(id: string, states: string[], mayBeGone = false): void {
    const e = this.expect.get(id);
    if (!e) return;
    e.states = [...new Set([...e.states, ...states])];
    e.mayBeGone ||= mayBeGone;
  }

  /** gone: a delete answered. */
  gone(id: string): void {
    this.expect.delete(id);
  }

  /**
   * adopt takes in the sandboxes of failed creates and forks that s shows (RUNNING or ERROR, in
   * request id order) and returns the violations of records that no call of the run made.
   */
  adopt(s: NodeSnapshot): string[] {
    const out: string[] = [];
    const found = s.records.filter((r) => !this.expect.has(r.id)).sort((a, b) => (a.metadata[REQUEST_KEY] ?? '').localeCompare(b.metadata[REQUEST_KEY] ?? ''));
    for (const r of found) {
      const rid = r.metadata[REQUEST_KEY] ?? '';
      if (!this.pending.has(rid)) {
        out.push(`record ${r.id} (${r.state}, request ${rid || 'none'}) that no call of this run made or that a call reported gone`);
        continue;
      }
      if (r.state !== 'RUNNING' && r.state !== 'ERROR') continue; // on its way: wait for it to rest
      this.pending.delete(rid);
      this.expect.set(r.id, { id: r.id, states: [r.state], pid: r.state === 'RUNNING' ? r.pid : 0, mayBeGone: false });
    }
    return out;
  }

  /**
   * settle narrows every expectation to what s shows once every invariant held: a sandbox
   * that may be in several states is in the one it shows, one that may be gone and is gone is
   * forgotten, and the failed creates whose sandbox did not appear never will.
   */
  settle(s: NodeSnapshot): void {
    const byId = new Map(s.records.map((r) => [r.id, r]));
    for (const e of this.expectations()) {
      const r = byId.get(e.id);
      if (!r) {
        this.expect.delete(e.id);
        continue;
      }
      e.states = [r.state];
      e.mayBeGone = false;
      if (!e.pid && r.state === 'RUNNING') e.pid = r.pid;
    }
    this.pending.clear();
  }
}
