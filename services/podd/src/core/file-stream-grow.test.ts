import { appendFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { downloadFile, STREAM_CHUNK_BYTES } from './file-stream';

// A sandbox process that appends to a file while it is downloaded (a log, or a hostile one that
// appends a chunk for every chunk read) must not make the download endless: a download is the
// file as it was opened (its first message says that size), as tar's header size bounds
// `kubectl cp` and `docker cp`.
describe('podd download of a file that grows while it streams', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-grow-'));
    mkdirSync(path.join(dir, 'ws'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test.each([
    ['from offset 0', 0],
    ['from an offset', 1000],
  ])('ends at the size it had when opened (%s)', async (_what, offset) => {
    const ws = path.join(dir, 'ws');
    const p = path.join(ws, 'grows.bin');
    const size = 2 * STREAM_CHUNK_BYTES + 17;
    writeFileSync(p, Buffer.alloc(size, 1));
    let announced = -1;
    let got = 0;
    let messages = 0;
    const chunk = Buffer.alloc(STREAM_CHUNK_BYTES, 2);
    for await (const c of downloadFile(p, offset, ws)) {
      if (announced < 0) announced = c.sizeBytes;
      got += c.data.length;
      appendFileSync(p, chunk); // the writer stays ahead of the reader
      if (++messages > 10) break; // without a bound it would never end
    }
    expect(announced).toBe(size);
    expect(got).toBe(size - offset);
    expect(messages).toBe(1 + Math.ceil((size - offset) / STREAM_CHUNK_BYTES)); // the size message, then the chunks
  });
});
