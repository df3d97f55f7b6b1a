/**
 * The server's ExecStream core over scripted podds: a podd without podd.exec-stream.v1 (a
 * template of an older release) or, for a pty, without podd.exec-pty.v1 is FAILED_PRECONDITION
 * before anything is asked; bad argv is INVALID_ARGUMENT; input reaches podd in order; the
 * stream holds one of the sandbox's Exec-stream slots until it ends.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, FailedPreconditionError, InvalidArgumentError, PODD_FEATURES, ResourceExhaustedError } from '@sandnode/shared';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from './__tests__/fake-peers';
import type { ExecInput, ExecStreamEvent, ExecStreamFirst } from './exec-stream';
import { SandboxManager } from './sandbox-manager';

const log = createLogger('test', '0', 'silent');

describe('server ExecStream core', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;
  const seen: string[] = [];

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-exec-stream-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    seen.length = 0;
    peers.execStreams = {
      async *execStream(first: ExecStreamFirst, input: AsyncIterable<ExecInput>): AsyncIterable<ExecStreamEvent> {
        seen.push(first.kind === 'start' ? `start ${first.start.argv.join(' ')} cwd=${first.start.cwd} pty=${first.start.pty}` : `attach ${first.execId}`);
        yield { kind: 'started', pid: 7, execId: 'ex-0123456789abcdef', pty: false, droppedBytes: 0 };
        for await (const i of input) {
          seen.push(i.kind === 'stdin' ? `stdin ${Buffer.from(i.data).toString()}` : i.kind);
          if (i.kind === 'stdin') yield { kind: 'stdout', data: i.data };
        }
        yield { kind: 'exit', exitCode: 0, signal: '' };
      },
      listProcesses: async () => [],
      signalProcess: async () => undefined,
    };
    m = new SandboxManager(managerOptions(peers, store, dir, { maxExecStreamsPerSandbox: 1 }));
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const create = async () => (await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' })).sandboxId;
  const start = (argv: string[], pty = false): ExecStreamFirst => ({ kind: 'start', start: { argv, env: {}, cwd: '', timeoutMs: 0, pty, detachKeepMs: 0 } });
  async function* inputs(...xs: ExecInput[]): AsyncIterable<ExecInput> {
    yield* xs;
  }

  it('a podd without podd.exec-stream.v1 (older template) is FAILED_PRECONDITION naming the feature; ListProcesses and SignalProcess too', async () => {
    const id = await create();
    const signal = new AbortController().signal;
    await expect(m.execStream(id, start(['sh']), inputs(), signal)).rejects.toThrow(FailedPreconditionError);
    await expect(m.execStream(id, start(['sh']), inputs(), signal)).rejects.toThrow(/podd.exec-stream.v1.*rebuild the template/);
    await expect(m.listProcesses(id)).rejects.toThrow(/podd.exec-stream.v1/);
    await expect(m.signalProcess(id, '', 5, 'SIGTERM')).rejects.toThrow(/podd.exec-stream.v1/);
    expect(seen).toEqual([]);
  });

  it('pty needs podd.exec-pty.v1; bad argv is INVALID_ARGUMENT before podd is asked', async () => {
    peers.poddFeatures = [PODD_FEATURES.execStream];
    const id = await create();
    const signal = new AbortController().signal;
    await expect(m.execStream(id, start(['sh'], true), inputs(), signal)).rejects.toThrow(/podd.exec-pty.v1/);
    await expect(m.execStream(id, start([]), inputs(), signal)).rejects.toThrow(InvalidArgumentError);
    await expect(m.execStream(id, { kind: 'start', start: { argv: ['sh'], env: {}, cwd: 'a\0b', timeoutMs: 0, pty: false, detachKeepMs: 0 } }, inputs(), signal)).rejects.toThrow(/^cwd/);
    expect(seen).toEqual([]);
  });

  it('relays input in order with the default cwd, and holds one Exec-stream slot until the stream ends', async () => {
    peers.poddFeatures = [PODD_FEATURES.execStream, PODD_FEATURES.execPty];
    const id = await create();
    const signal = new AbortController().signal;
    const events = await m.execStream(
      id,
      start(['cat'], true),
      inputs({ kind: 'stdin', data: Buffer.from('a') }, { kind: 'resize', size: { rows: 2, cols: 3 } }, { kind: 'stdin', data: Buffer.from('b') }, { kind: 'closeStdin' }),
      signal,
    );
    // the slot is held: a second stream of this sandbox is refused (maxExecStreamsPerSandbox 1)
    await expect(m.execStream(id, start(['cat']), inputs(), signal)).rejects.toThrow(ResourceExhaustedError);
    const got: ExecStreamEvent[] = [];
    for await (const ev of events) got.push(ev);
    expect(seen).toEqual(['start cat cwd=/workspace pty=true', 'stdin a', 'resize', 'stdin b', 'closeStdin']);
    expect(got.map((e) => e.kind)).toEqual(['started', 'stdout', 'stdout', 'exit']);
    // ended: the slot is free again
    const again = await m.execStream(id, { kind: 'attach', execId: 'ex-0123456789abcdef' }, inputs(), signal);
    for await (const _ of again) void _;
    expect(seen.at(-1)).toBe('attach ex-0123456789abcdef');
  });
});
