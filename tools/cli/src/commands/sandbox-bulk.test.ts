/**
 * The CLI's side of the bulk channel against a hostile peer (a podd that lies about sizes) on
 * real unix sockets, and the fallback to gRPC when the server lacks PrepareBulkTransfer.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc-common';
import { errorLine, type ServerApi } from '@sandnode/shared';
import { bulkDownload, bulkUpload, downloadRequest, openBulk } from './sandbox-bulk';

let tmp: string;
beforeEach(() => (tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bulk-'))));
afterEach(() => rmSync(tmp, { recursive: true, force: true }));

/** pair is a connected unix socket pair: [the CLI's end (paused), the fake podd's end]. */
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

async function download(send: (peer: net.Socket) => void): Promise<{ err?: Error; size?: number }> {
  const [c, peer, close] = await pair();
  const fh = await open(path.join(tmp, 'out'), 'w');
  try {
    send(peer);
    const size = await bulkDownload(
      c,
      fh,
      0,
      createHash('sha256'),
      () => undefined,
      () => undefined,
    );
    return { size };
  } catch (err) {
    return { err: err as Error };
  } finally {
    await fh.close();
    peer.destroy();
    close();
  }
}

test('a download of exactly the announced size is taken', async () => {
  const r = await download((p) => p.end(Buffer.concat([Buffer.from('{"sizeBytes":10}\n'), Buffer.alloc(10, 7)])));
  expect(r).toEqual({ size: 10 });
});

test('a podd that sends more than it announced is stopped', async () => {
  const r = await download((p) => p.end(Buffer.concat([Buffer.from('{"sizeBytes":10}\n'), Buffer.alloc(20, 7)])));
  expect(r.err?.message).toMatch(/more than the 10 bytes it announced/);
});

test('a podd that sends the announced bytes in one piece and more in a later one is stopped', async () => {
  const r = await download((p) => {
    p.write(Buffer.concat([Buffer.from('{"sizeBytes":4}\n'), Buffer.alloc(4, 1)]));
    setTimeout(() => p.end(Buffer.alloc(3, 2)), 50);
  });
  expect(r.err?.message).toMatch(/more than the 4 bytes it announced/);
});

test('a short stream, a size that is no byte count and an endless line are errors', async () => {
  expect((await download((p) => p.end(Buffer.concat([Buffer.from('{"sizeBytes":10}\n'), Buffer.alloc(3)])))).err?.message).toMatch(/ended at byte 3 of 10/);
  expect((await download((p) => p.end('{"sizeBytes":-1}\n'))).err?.message).toMatch(/no byte count/);
  expect((await download((p) => p.end('{"sizeBytes":1e300}\n'))).err?.message).toMatch(/no byte count/);
  expect((await download((p) => p.end(Buffer.alloc(70 * 1024, 0x61)))).err?.message).toMatch(/longer than/);
  expect((await download((p) => p.end('{"error":{"code":5,"message":"no such file"}}\n'))).err).toMatchObject({ code: Status.NOT_FOUND });
});

test('openBulk falls back (undefined) when the server lacks PrepareBulkTransfer or the podd the feature, or the server is not on a unix socket', async () => {
  const api = (address: string, code: Status, details: string) =>
    ({
      address,
      sandboxes: {
        prepareBulkTransfer: () => Promise.reject(new ClientError('/sandnode.server.v1.SandboxService/PrepareBulkTransfer', code, details)),
      },
    }) as unknown as ServerApi;
  const req = downloadRequest('sb-0123456789abcdef', 'f', 0);
  await expect(openBulk(api('unix:///run/x.sock', Status.UNIMPLEMENTED, 'Method not found'), req)).resolves.toBeUndefined();
  await expect(openBulk(api('unix:///run/x.sock', Status.UNIMPLEMENTED, 'the podd lacks feature "podd.files.bulk.v1"'), req)).resolves.toBeUndefined();
  await expect(openBulk(api('127.0.0.1:1', Status.OK, ''), req)).resolves.toBeUndefined();
  // other refusals are the copy's errors, not a reason to try another way
  await expect(openBulk(api('unix:///run/x.sock', Status.NOT_FOUND, 'no sandbox'), req)).rejects.toMatchObject({ code: Status.NOT_FOUND });
});

/**
 * Attacker finding (fixed): podd refuses an upload at once (a symlink or fifo at the target) by
 * writing its error line and closing; the CLI said "the sandbox closed the bulk connection during
 * the upload" and lost podd's reason and code.
 */
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
