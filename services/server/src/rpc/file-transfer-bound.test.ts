import { InternalError, PODD_FEATURES } from '@sandnode/shared';
import type { SandboxManager } from '../core/sandbox-manager';
import type { SandboxRecord } from '../core/types';
import { fileTransferService, type PoddFileRelay } from './file-transfer-service';

const ID = 'sb-0123456789abcdef';
const MIB = 1024 * 1024;
const ctx = { signal: new AbortController().signal } as never;

const manager = { get: (id: string) => ({ sandboxId: id, state: 'RUNNING', poddAddress: 'unix:///nowhere.sock' }) as unknown as SandboxRecord } as unknown as SandboxManager;

// podd runs inside the sandbox: a hostile one can announce a size and then stream without end
// (an API caller that trusts the stream fills its disk). The relay ends the stream at the first
// byte past the announced size with INTERNAL naming the sandbox.
describe('DownloadFile relay (server) of a podd that sends past the size it announced', () => {
  test('ends with INTERNAL at the first message past the size; what came before is relayed', async () => {
    let sent = 0;
    const client = {
      async *downloadFile() {
        yield { data: Buffer.alloc(0), offset: 0, sizeBytes: 3 * MIB };
        for (let pos = 0; pos < 64 * MIB; pos += MIB) {
          sent += MIB;
          yield { data: Buffer.alloc(MIB, 1), offset: pos, sizeBytes: 0 };
        }
      },
    };
    const podds = { raw: () => ({ client, features: { get: async () => ({ version: '0.3.0', features: [PODD_FEATURES.filesStream], component: 'podd' }) } }) } as unknown as PoddFileRelay;
    const svc = fileTransferService(manager, podds);
    let relayed = 0;
    const run = async () => {
      for await (const m of svc.downloadFile({ sandboxId: ID, path: 'f', offset: 0 }, ctx) as AsyncIterable<{ data: Uint8Array }>) relayed += m.data.length;
    };
    const err = await run().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toMatch(new RegExp(`${ID}.*more than the 3145728 bytes`));
    expect(relayed).toBe(3 * MIB);
    expect(sent).toBe(4 * MIB);
  });
});

// ListDirectory entries come from podd: a name with "/", NUL, "." or ".." would lead an API
// caller that joins names into paths (a recursive copy) out of the directory it copies into.
describe('ListDirectory relay (server) of a podd that names entries as paths', () => {
  test.each(['../../etc/cron.d/x', 'a/b', '..', '.', '', 'a\0b'])('an entry named %j is INTERNAL naming the sandbox; nothing is returned', async (bad) => {
    const entry = (name: string) => ({ name, type: 1, sizeBytes: 1, mode: 0o644, mtimeMs: 0 });
    const client = { listDirectory: async () => ({ entries: [entry('ok'), entry(bad)], nextPageToken: '' }) };
    const podds = { raw: () => ({ client, features: { get: async () => ({ version: '0.3.0', features: [PODD_FEATURES.filesStream], component: 'podd' }) } }) } as unknown as PoddFileRelay;
    const svc = fileTransferService(manager, podds);
    const err = await Promise.resolve(svc.listDirectory({ sandboxId: ID, path: '', pageSize: 10, pageToken: '' }, ctx)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toMatch(new RegExp(`${ID}.*not a file name`));
  });

  test('plain names, non-ASCII and dot-files included, are relayed', async () => {
    const names = ['a', '.hidden', '..x', 'dé字😀', 'x y'];
    const client = { listDirectory: async () => ({ entries: names.map((name) => ({ name, type: 1, sizeBytes: 1, mode: 0o644, mtimeMs: 0 })), nextPageToken: '' }) };
    const podds = { raw: () => ({ client, features: { get: async () => ({ version: '0.3.0', features: [PODD_FEATURES.filesStream], component: 'podd' }) } }) } as unknown as PoddFileRelay;
    const r = await fileTransferService(manager, podds).listDirectory({ sandboxId: ID, path: '', pageSize: 10, pageToken: '' }, ctx);
    expect((r.entries ?? []).map((e) => e.name)).toEqual(names);
  });
});
