/**
 * A sandbox's environment (CreateSandboxRequest.env, feature server.sandbox-env.v1): kept in the
 * record, added to every Exec under the call's own env, kept by a fork child and across a
 * restart of the server (records.db), shown by name only; bad entries are INVALID_ARGUMENT and
 * create nothing.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, InvalidArgumentError } from '@sandnode/shared';
import { sandboxToPb } from '../rpc/convert';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { SandboxManager } from './sandbox-manager';
import type { ExecArgs, ExecEvent } from './types';

const log = createLogger('test', '0', 'silent');

describe('a sandbox environment', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;
  const seen: Record<string, string>[] = [];

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-env-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    seen.length = 0;
    peers.exec = async function* (args: ExecArgs): AsyncIterable<ExecEvent> {
      seen.push(args.env);
      yield { kind: 'started', pid: 1 };
      yield { kind: 'exit', exitCode: 0, signal: '' };
    };
    m = new SandboxManager(managerOptions(peers, store, dir));
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const run = async (mgr: SandboxManager, id: string, env: Record<string, string> = {}) => {
    for await (const _ of mgr.exec(id, { argv: ['env'], env, cwd: '', stdin: new Uint8Array(), timeoutMs: 0 }, new AbortController().signal)) void _;
    return seen.at(-1);
  };
  const create = (env?: Record<string, string>) => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '', env });

  it("every Exec starts with the sandbox's env, the call's own winning per name; GetSandbox shows the names only", async () => {
    const s = await create({ API_KEY: 's3cret', MODE: 'prod' });
    expect(await run(m, s.sandboxId)).toEqual({ API_KEY: 's3cret', MODE: 'prod' });
    expect(await run(m, s.sandboxId, { MODE: 'dev', X: '1' })).toEqual({ API_KEY: 's3cret', MODE: 'dev', X: '1' });
    const view = sandboxToPb(m.get(s.sandboxId));
    expect(view.envKeys).toEqual(['API_KEY', 'MODE']);
    expect(JSON.stringify(view)).not.toContain('s3cret');
  });

  it('a sandbox created without env adds nothing', async () => {
    const s = await create();
    expect(await run(m, s.sandboxId, { A: 'b' })).toEqual({ A: 'b' });
    expect(sandboxToPb(m.get(s.sandboxId)).envKeys).toEqual([]);
  });

  it("a fork child keeps its parent's env; a restarted server (records.db read again) still applies it", async () => {
    const s = await create({ TOKEN: 't' });
    const f = await m.fork({ parentId: s.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '' });
    expect(await run(m, f.child.sandboxId)).toEqual({ TOKEN: 't' });
    store.close();
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    const again = new SandboxManager(managerOptions(peers, store, dir));
    expect(await run(again, s.sandboxId)).toEqual({ TOKEN: 't' });
    expect(await run(again, f.child.sandboxId)).toEqual({ TOKEN: 't' });
  });

  it.each([
    [{ '1BAD': 'x' }, /env: name "1BAD" must match/],
    [{ 'A=B': 'x' }, /env: name "A=B" must match/],
    [{ A: 'nul\0here' }, /env\[A\]: the value contains a NUL byte/],
    [Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`V${i}`, 'x'])), /env: 65 variables, at most 64/],
    [{ BIG: 'x'.repeat(70_000) }, /env: 70005 bytes as NAME=VALUE, at most 65536 together/],
  ])('bad env %#: INVALID_ARGUMENT naming the entry, no value echoed, nothing created', async (env, msg) => {
    const before = [store.list().length, peers.vms.size, peers.devices.size];
    const p = create(env);
    await expect(p).rejects.toThrow(InvalidArgumentError);
    await expect(create(env)).rejects.toThrow(msg);
    await p.catch((e: Error) => expect(e.message).not.toContain('nul\0here'));
    expect([store.list().length, peers.vms.size, peers.devices.size]).toEqual(before);
  });
});
