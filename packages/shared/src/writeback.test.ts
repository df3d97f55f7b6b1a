/** writeback.ts: a background fdatasync every N bytes, one at a time; its failure reaches drain. */
import { mkdtempSync, rmSync } from 'node:fs';
import { open } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { WritebackPacer } from './writeback';

describe('WritebackPacer', () => {
  it('starts an fdatasync once every everyBytes, never two at once, and drain waits for it', async () => {
    let running = 0;
    let most = 0;
    let calls = 0;
    let release: () => void = () => undefined;
    const fh = {
      datasync: () => {
        calls++;
        running++;
        most = Math.max(most, running);
        return new Promise<void>((r) => (release = () => (running--, r())));
      },
    };
    const p = new WritebackPacer(fh, 100);
    p.wrote(60);
    expect(calls).toBe(0);
    p.wrote(60); // 120 pending: one starts
    expect(calls).toBe(1);
    p.wrote(500); // one runs: none more
    expect(calls).toBe(1);
    let drained = false;
    const d = p.drain().then(() => (drained = true));
    await new Promise((r) => setImmediate(r));
    expect(drained).toBe(false);
    release();
    await d;
    expect(drained).toBe(true);
    p.wrote(100);
    expect(calls).toBe(2);
    release();
    await p.drain();
    expect({ most, started: p.started }).toEqual({ most: 1, started: 2 });
  });

  it('a failed background fdatasync is thrown by drain, not lost', async () => {
    const err = Object.assign(new Error('EIO'), { code: 'EIO' });
    const p = new WritebackPacer({ datasync: () => Promise.reject(err) }, 1);
    p.wrote(1);
    await expect(p.drain()).rejects.toBe(err);
  });

  it('on a real file: the bytes written are the bytes read back', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'writeback-'));
    try {
      const fh = await open(path.join(dir, 'f'), 'w+');
      const p = new WritebackPacer(fh, 1024 * 1024);
      const chunk = Buffer.alloc(256 * 1024, 7);
      for (let i = 0; i < 16; i++) {
        await fh.write(chunk, 0, chunk.length, i * chunk.length);
        p.wrote(chunk.length);
      }
      await p.drain();
      await fh.sync();
      expect((await fh.stat()).size).toBe(16 * chunk.length);
      expect(p.started).toBeGreaterThanOrEqual(1);
      await fh.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
