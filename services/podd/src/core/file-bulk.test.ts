/**
 * podd's count of bulk transfers (Health bulk_transfers): a download whose reader has not taken
 * the bytes yet counts until it ends, and a bad request counts only while it is answered, so the
 * server's idle actions wait exactly while a transfer runs.
 */
import net from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { activeBulkTransfers, serveBulk } from './file-bulk';

describe('podd bulk transfers count', () => {
  let dir: string;
  let server: net.Server;
  let sock: string;
  const served: Promise<void>[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bulk-count-'));
    writeFileSync(path.join(dir, 'big'), Buffer.alloc(32 * 1024 * 1024, 7));
    sock = path.join(dir, 's.sock');
    server = net.createServer((s) => {
      s.pause();
      served.push(serveBulk(s).catch(() => undefined));
    });
    await new Promise<void>((r) => server.listen(sock, r));
  });
  afterAll(async () => {
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
  });

  const until = async (what: () => boolean) => {
    for (let i = 0; i < 500 && !what(); i++) await new Promise((r) => setTimeout(r, 10));
    return what();
  };

  it('a download counts from its request to its end', async () => {
    expect(activeBulkTransfers()).toBe(0);
    const c = net.connect(sock);
    c.pause();
    c.write(`${JSON.stringify({ op: 'download', path: path.join(dir, 'big'), offset: 0, beneath: dir })}\n`);
    // the reader takes nothing: 32 MiB cannot all be in the socket buffers, the transfer runs
    expect(await until(() => activeBulkTransfers() === 1)).toBe(true);
    await new Promise((r) => setTimeout(r, 100));
    expect(activeBulkTransfers()).toBe(1);
    let got = 0;
    c.on('data', (d: Buffer) => (got += d.length));
    c.resume();
    await new Promise((r) => c.on('close', r));
    await Promise.all(served);
    expect(got).toBeGreaterThan(32 * 1024 * 1024);
    expect(activeBulkTransfers()).toBe(0);
  });

  it('a bad request line is answered and counts no more', async () => {
    const c = net.connect(sock);
    c.write('{"op":"nope"}\n');
    let text = '';
    c.on('data', (d: Buffer) => (text += d.toString()));
    await new Promise((r) => c.on('close', r));
    await Promise.all(served);
    expect(JSON.parse(text)).toMatchObject({ error: { code: 3 } });
    expect(activeBulkTransfers()).toBe(0);
  });
});
