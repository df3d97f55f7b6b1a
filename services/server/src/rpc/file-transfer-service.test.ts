import { FailedPreconditionError, InvalidArgumentError, PODD_FEATURES, UnimplementedError } from '@sandnode/shared';
import type { SandboxManager } from '../core/sandbox-manager';
import type { SandboxRecord } from '../core/types';
import { FileStreams, fileTransferService, type PoddFileRelay } from './file-transfer-service';

const ID = 'sb-0123456789abcdef';

function manager(state: string): SandboxManager {
  return { get: (id: string) => ({ sandboxId: id, state, poddAddress: 'unix:///nowhere.sock' }) as unknown as SandboxRecord } as unknown as SandboxManager;
}

/** relay answers GetVersion with features and records the podd calls it is asked for. */
function relay(features: string[], calls: string[]): PoddFileRelay {
  const client = {
    stat: async (req: { path: string; beneath: string }) => {
      calls.push(`stat ${req.path} ${req.beneath}`);
      return { type: 1, sizeBytes: 3, mode: 0o644, mtimeMs: 1 };
    },
  };
  return { raw: () => ({ client, features: { get: async () => ({ version: '0.2.0', features, component: 'podd' }) } }) } as unknown as PoddFileRelay;
}

const ctx = { signal: new AbortController().signal } as never;

describe('file transfer relay (server)', () => {
  test('a podd without podd.files.stream.v1 is UNIMPLEMENTED naming its version and the feature; nothing is asked of it', async () => {
    const calls: string[] = [];
    const svc = fileTransferService(manager('RUNNING'), relay([PODD_FEATURES.files], calls));
    const err = await svc.statFile({ sandboxId: ID, path: 'f' }, ctx).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnimplementedError);
    expect((err as Error).message).toMatch(/podd 0\.2\.0.*podd\.files\.stream\.v1/);
    expect(calls).toEqual([]);
  });

  test('a sandbox that is not RUNNING is FAILED_PRECONDITION naming its state', async () => {
    const svc = fileTransferService(manager('PAUSED'), relay([PODD_FEATURES.filesStream], []));
    await expect(svc.statFile({ sandboxId: ID, path: 'f' }, ctx)).rejects.toThrow(FailedPreconditionError);
    await expect(svc.statFile({ sandboxId: ID, path: 'f' }, ctx)).rejects.toThrow(/is PAUSED.*resume/);
  });

  test('paths are confined to /workspace before podd is asked; podd gets beneath /workspace', async () => {
    const calls: string[] = [];
    const svc = fileTransferService(manager('RUNNING'), relay([PODD_FEATURES.filesStream], calls));
    for (const bad of ['../x', '/etc/passwd', 'a\0b']) await expect(svc.statFile({ sandboxId: ID, path: bad }, ctx)).rejects.toThrow(InvalidArgumentError);
    const r = await svc.statFile({ sandboxId: ID, path: 'a/f' }, ctx);
    expect(r.info).toMatchObject({ name: 'f', sizeBytes: 3 });
    await svc.statFile({ sandboxId: ID, path: '' }, ctx);
    expect(calls).toEqual(['stat /workspace/a/f /workspace', 'stat /workspace /workspace']);
  });

  test('an upload whose first message is not its header is INVALID_ARGUMENT', async () => {
    const svc = fileTransferService(manager('RUNNING'), relay([PODD_FEATURES.filesStream], []));
    async function* data() {
      yield { part: { $case: 'data' as const, value: Buffer.from('x') } };
    }
    await expect(svc.uploadFile(data(), ctx)).rejects.toThrow(/header/);
  });

  test('transfers per sandbox are capped: one more is RESOURCE_EXHAUSTED, a finished one frees its slot', async () => {
    const held: Array<() => void> = [];
    const client = {
      downloadFile: async function* () {
        yield { data: Buffer.alloc(0), offset: 0, sizeBytes: 1 };
        await new Promise<void>((r) => held.push(r));
      },
    };
    const podds = { raw: () => ({ client, features: { get: async () => ({ version: 'x', features: [PODD_FEATURES.filesStream] }) } }) } as unknown as PoddFileRelay;
    const svc = fileTransferService(manager('RUNNING'), podds, { streams: 0 }, new FileStreams(2));
    const open = async () => {
      const it = svc.downloadFile({ sandboxId: ID, path: 'f', offset: 0 }, ctx)[Symbol.asyncIterator]();
      await it.next();
      return it;
    };
    const a = await open();
    await open();
    await expect(open()).rejects.toThrow(/2 file transfers running/);
    const done = a.next();
    held.shift()?.();
    await done;
    await expect(open()).resolves.toBeDefined();
    for (const r of held) r();
  });
});
