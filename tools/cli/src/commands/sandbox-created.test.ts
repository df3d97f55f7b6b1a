/**
 * The last line of `sandbox create`: a repeat by the user's own --request-id says that nothing
 * was created (before: "created in 0 ms", as if a sandbox had been made in no time); a repeat by
 * the CLI's own id (the client's retry joining its first attempt) still reads as a create.
 */
import { createdText } from './sandbox';

describe('sandbox create: the line after the sandbox', () => {
  const fresh = { createMs: 812, fromPool: false, poolMiss: '', repeat: false };
  test('a create: its time, and where it came from', () => {
    expect(createdText(fresh, '')).toBe('created in 812 ms');
    expect(createdText({ ...fresh, fromPool: true, createMs: 4 }, 'job-1')).toBe('created in 4 ms (from the warm pool)');
    expect(createdText({ ...fresh, poolMiss: 'the pool of base is empty' }, '')).toBe('created in 812 ms (cold: the pool of base is empty)');
  });
  test("a repeat of the user's request id: nothing was created", () => {
    const t = createdText({ ...fresh, createMs: 0, repeat: true }, 'job-1');
    expect(t).toBe('already created by an earlier create with request id job-1: nothing new was created');
    expect(t).not.toMatch(/created in/);
  });
  test("a repeat of the CLI's own id is the client's retry of this call", () => {
    expect(createdText({ ...fresh, repeat: true }, '')).toBe('created in 812 ms (after a retry that joined the create)');
  });
});
