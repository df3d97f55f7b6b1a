/**
 * Attacker finding (fixed): a gRPC download (TCP, or SANDNODE_CP_GRPC=1) whose stream ends
 * before the size its first message announced was committed short. It must fail and commit nothing.
 */
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { ServerApi } from '@sandnode/node-stack';
import { download } from './sandbox-files';

// `sandbox cp sb-..:PATH LOCAL` over gRPC (TCP, or SANDNODE_CP_GRPC=1): podd's downloadFile ends
// the stream early when the file shrinks while it is read (file-stream.ts readAt: bytesRead 0 ->
// return), and a hostile podd can do the same on purpose. The first message announced the size:
// a stream that ends short of it is cut, and the copy must fail without committing (as the bulk
// path does: sandbox-bulk.ts "a stream shorter than it is an error and the local file is never
// committed").
describe('sandbox cp download of a stream that ends before the announced size', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'cli-short-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const shortApi = {
    sandboxes: {
      async *downloadFile() {
        yield { data: Buffer.alloc(0), offset: 0, sizeBytes: 10 };
        yield { data: Buffer.from('abcd'), offset: 0, sizeBytes: 0 };
        // the stream ends cleanly after 4 of the 10 bytes
      },
    },
  } as unknown as ServerApi;

  test('a new file: the copy fails and leaves nothing', async () => {
    await expect(download(shortApi, { sandboxId: 'sb-0123456789abcdef', path: '/workspace/f' }, `${dir}/`, { json: true })).rejects.toThrow(/10/);
    expect(readdirSync(dir)).toEqual([]);
  });

  test('an existing file is not replaced by the 4 bytes', async () => {
    writeFileSync(path.join(dir, 'f'), 'the old content');
    await expect(download(shortApi, { sandboxId: 'sb-0123456789abcdef', path: '/workspace/f' }, `${dir}/`, { json: true })).rejects.toThrow();
    expect(readdirSync(dir)).toEqual(['f']);
  });
});
