/**
 * Attacker finding (fixed): podd refuses an upload at once (the target is a symlink, a fifo:
 * `sandbox cp ./f sb-…:pw` with /workspace/pw -> ../../etc/passwd) by writing its error line
 * and closing (file-bulk.ts serveBulk: socket.end(errorLine(err))). The CLI printed "the sandbox
 * closed the bulk connection during the upload" and lost podd's reason and code
 * (FAILED_PRECONDITION "... is a symlink; uploads below /workspace do not follow symlinks"),
 * which the download side reports. Now it gives the ClientError of podd's line.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { errorLine } from '@sandnode/shared';
import { bulkUpload } from './sandbox-bulk';

let tmp: string;
beforeEach(() => (tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bulk-refuse-'))));
afterEach(() => rmSync(tmp, { recursive: true, force: true }));

async function pair(): Promise<[net.Socket, net.Socket, () => void]> {
  const p = path.join(tmp, 's.sock');
  let peer!: net.Socket;
  const srv = net.createServer((s) => (peer = s));
  await new Promise<void>((r) => srv.listen(p, r));
  const c = net.connect(p);
  c.pause();
  await new Promise<void>((r) => c.once('connect', () => r()));
  while (!peer) await new Promise((r) => setTimeout(r, 5));
  return [c, peer, () => srv.close()];
}

const refusal = Object.assign(new Error('path: /workspace/pw is a symlink; uploads below /workspace do not follow symlinks'), { code: Status.FAILED_PRECONDITION });

it.each([6, 8 * 1024 * 1024])('a podd that refuses a %d-byte upload at once (error line, then close) is reported with its code and reason', async (size) => {
  const src = path.join(tmp, 'src');
  writeFileSync(src, Buffer.alloc(size, 1));
  const [c, peer, close] = await pair();
  peer.on('error', () => undefined);
  // as podd: the request line came from the server; it refuses before reading any data
  peer.end(errorLine(refusal), () => peer.destroySoon());
  await new Promise((r) => setTimeout(r, 50));
  let err: Error | undefined;
  try {
    await bulkUpload(c, src, 0, size, [createHash('sha256')], () => undefined);
  } catch (e) {
    err = e as Error;
  } finally {
    close();
  }
  expect(err?.message).toContain('is a symlink');
  expect((err as { code?: unknown } | undefined)?.code).toBe(Status.FAILED_PRECONDITION);
});
