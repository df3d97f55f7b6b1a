/**
 * The transition table of runtime records: the header's table is TRANSITIONS, every allowed
 * move is made, refused moves throw the typed error and change nothing, the operations'
 * preconditions stay inside the table, and a newer server's state is never moved by accident.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError, InternalError, Status } from '@sandnode/shared';
import { canMove, IllegalTransitionError, INITIAL_STATE, OPERATION_STATES, requireState, transition, TRANSITIONS } from './transitions';
import type { SandboxRecord, SandboxState } from './types';

const STATES = Object.keys(TRANSITIONS) as SandboxState[];

function rec(state: string): SandboxRecord {
  return { sandboxId: 'sb-0123456789abcdef', state } as unknown as SandboxRecord;
}

/** The "FROM --> TO (...) | TO ..." lines of the file header. */
function headerTable(): Map<string, string[]> {
  const src = readFileSync(path.join(__dirname, 'transitions.ts'), 'utf8');
  const header = src.slice(0, src.indexOf('*/'));
  const table = new Map<string, string[]>();
  for (const line of header.split('\n')) {
    const m = /^ \*\s+(\(new\)|[A-Z]+)\s+-->\s+(.*)$/.exec(line);
    if (!m) continue;
    const targets = m[2]!
      .replace(/\([^)]*\)/g, '')
      .split('|')
      .map((t) => t.trim());
    table.set(m[1]!, targets);
  }
  return table;
}

describe('the runtime record transition table', () => {
  it("the file header's table is TRANSITIONS, row by row (DRAINED included)", () => {
    const header = headerTable();
    expect(header.get('(new)')).toEqual([INITIAL_STATE]);
    header.delete('(new)');
    expect(Object.fromEntries(header)).toEqual(Object.fromEntries(STATES.map((s) => [s, [...TRANSITIONS[s]]])));
    expect(header.get('DRAINED')).toEqual(['RUNNING', 'DELETING']);
  });

  it('makes every allowed move', () => {
    let moves = 0;
    for (const from of STATES) {
      for (const to of TRANSITIONS[from]) {
        const r = rec(from);
        transition(r, to);
        expect(r.state).toBe(to);
        moves++;
      }
    }
    expect(moves).toBe(17);
  });

  it.each([
    ['CREATING', 'PAUSED'],
    ['CREATING', 'DRAINED'],
    ['RUNNING', 'CREATING'],
    ['RUNNING', 'RUNNING'],
    ['PAUSED', 'PAUSED'],
    ['DRAINED', 'PAUSED'],
    ['DRAINED', 'ERROR'],
    ['ERROR', 'DRAINED'],
    ['DELETING', 'RUNNING'],
    ['DELETING', 'CREATING'],
  ] as [SandboxState, SandboxState][])('refuses %s -> %s with an INTERNAL IllegalTransitionError and leaves the record', (from, to) => {
    const r = rec(from);
    const err = (() => {
      try {
        transition(r, to);
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(err).toBeInstanceOf(IllegalTransitionError);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as InternalError).code).toBe(Status.INTERNAL);
    expect((err as Error).message).toBe(`sandbox sb-0123456789abcdef: ${from} -> ${to} is not a transition of a runtime record`);
    expect(r.state).toBe(from);
  });

  it('never moves a record into UNKNOWN or CREATING', () => {
    for (const from of STATES) {
      expect(canMove(from, 'UNKNOWN')).toBe(false);
      expect(canMove(from, 'CREATING')).toBe(false);
    }
  });

  it("moves a newer server's state (UNKNOWN) only to DELETING, and a state not in the table not at all", () => {
    for (const to of STATES) expect(canMove('UNKNOWN', to)).toBe(to === 'DELETING');
    for (const newer of ['MIGRATING', 'CHECKPOINTED', 'constructor', 'toString', '__proto__', '']) {
      for (const to of STATES) expect(canMove(newer, to)).toBe(false);
      const r = rec(newer);
      expect(() => transition(r, 'DELETING')).toThrow(IllegalTransitionError);
      expect(r.state).toBe(newer);
    }
  });

  it('every state a caller-facing operation accepts is a real state, and an operation that moves a record moves it along the table', () => {
    const moves: Partial<Record<keyof typeof OPERATION_STATES, SandboxState>> = { PauseSandbox: 'PAUSED', ResumeSandbox: 'RUNNING', ResetRootfs: 'DRAINED', Drain: 'DRAINED' };
    for (const [op, states] of Object.entries(OPERATION_STATES)) {
      for (const s of states) {
        expect(STATES).toContain(s);
        const to = moves[op as keyof typeof OPERATION_STATES];
        if (to) expect([op, s, canMove(s, to)]).toEqual([op, s, true]);
      }
    }
  });

  it('requireState: FAILED_PRECONDITION naming the state and what the operation needs; the record is returned otherwise', () => {
    const r = rec('PAUSED');
    expect(requireState(r, 'ResumeSandbox')).toBe(r);
    expect(() => requireState(r, 'Exec')).toThrow(new FailedPreconditionError('sandbox sb-0123456789abcdef is PAUSED; Exec needs RUNNING'));
    // `sandbox ps` of a drained sandbox names its own call (newcomer: it said "Exec needs RUNNING")
    expect(() => requireState(rec('DRAINED'), 'ListProcesses')).toThrow(new FailedPreconditionError('sandbox sb-0123456789abcdef is DRAINED; ListProcesses needs RUNNING'));
    expect(() => requireState(rec('UNKNOWN'), 'ResumeSandbox')).toThrow(/is UNKNOWN; ResumeSandbox needs PAUSED or DRAINED/);
    expect(() => requireState(rec('UNKNOWN'), 'ResumeSandbox')).toThrow(FailedPreconditionError);
  });
});
