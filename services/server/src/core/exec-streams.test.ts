/**
 * The per-sandbox cap on running Exec streams (issue 10 §5: 500 exec streams made podd run out
 * of fds): one above the cap is RESOURCE_EXHAUSTED and reaches no podd; a stream that ends,
 * fails or whose caller goes away gives its slot back; other sandboxes are not affected.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, ResourceExhaustedError } from '@sandnode/shared';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { SandboxManager } from './sandbox-manager';
import type { ExecArgs, ExecEvent } from './types';

const log = createLogger('test', '0', 'silent');

describe('Exec streams per sandbox', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;
  let started = 0;
  const finish: (() => void)[] = [];

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-exec-streams-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    started = 0;
    finish.length = 0;
    // a podd whose commands run until the test ends them (or the caller goes away)
    peers.exec = async function* (_args: ExecArgs, signal: AbortSignal): AsyncIterable<ExecEvent> {
      started++;
      yield { kind: 'started', pid: 1 };
      await new Promise<void>((resolve, reject) => {
        finish.push(resolve);
        signal.addEventListener('abort', () => reject(new Error('cancelled')), { once: true });
      });
      yield { kind: 'exit', exitCode: 0, signal: '' };
    };
    m = new SandboxManager(managerOptions(peers, store, dir, { maxExecStreamsPerSandbox: 3 }));
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const args: ExecArgs = { argv: ['sleep', '60'], env: {}, cwd: '', stdin: new Uint8Array(), timeoutMs: 0 };
  const create = async () => (await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' })).sandboxId;
  /** open starts a stream and reads its first event; `ended` settles with the stream */
  const open = async (id: string, signal = new AbortController().signal): Promise<{ ended: Promise<void> }> => {
    const it = m.exec(id, args, signal)[Symbol.asyncIterator]();
    expect((await it.next()).value).toEqual({ kind: 'started', pid: 1 });
    const ended = (async () => {
      for (;;) if ((await it.next()).done) return;
    })();
    ended.catch(() => undefined);
    return { ended };
  };

  it('refuses the stream above the cap with RESOURCE_EXHAUSTED before podd is asked; an ended stream frees its slot', async () => {
    const id = await create();
    const running = [await open(id), await open(id), await open(id)];
    expect(() => m.exec(id, args, new AbortController().signal)).toThrow(ResourceExhaustedError);
    expect(() => m.exec(id, args, new AbortController().signal)).toThrow(/3 Exec streams running.*maxExecStreamsPerSandbox/);
    expect(started).toBe(3);
    finish.shift()!();
    await running[0]!.ended;
    const again = await open(id);
    expect(started).toBe(4);
    for (const f of finish.splice(0)) f();
    await Promise.all([...running.slice(1), again].map((r) => r.ended));
  });

  it('a caller that goes away frees its slot, even before reading; another sandbox has its own slots', async () => {
    const a = await create();
    const b = await create();
    const ac = new AbortController();
    const first = await open(a, ac.signal);
    const unread = new AbortController();
    m.exec(a, args, unread.signal); // never read
    await open(a);
    expect(() => m.exec(a, args, new AbortController().signal)).toThrow(ResourceExhaustedError);
    await open(b); // b is not limited by a
    ac.abort();
    await expect(first.ended).rejects.toThrow('cancelled');
    unread.abort();
    await open(a);
    await open(a);
    expect(() => m.exec(a, args, new AbortController().signal)).toThrow(ResourceExhaustedError);
    for (const f of finish.splice(0)) f();
  });
});
