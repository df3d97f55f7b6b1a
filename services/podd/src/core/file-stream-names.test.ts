import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { uploadFile, type UploadPart } from './file-stream';
import { MAX_NAME_BYTES } from './limits';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

async function* parts(p: string, data: Buffer, beneath: string): AsyncIterable<UploadPart> {
  yield { header: { path: p, offset: 0, mode: 0, createParents: false, inPlace: false, beneath } };
  yield { data };
  yield { end: { sha256: sha(data) } };
}

// An upload at offset 0 writes a temp file `.<name>.sandnode-upload-<12 hex>` beside its target.
// The name is cut to fit NAME_MAX: by bytes, not by UTF-16 units, or a long non-ASCII name that
// checkStreamPath accepts (at most 255 bytes) makes a temp name above 255 bytes (ENAMETOOLONG).
describe('podd upload temp names stay within NAME_MAX', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-names-'));
    mkdirSync(path.join(dir, 'ws'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test.each([
    ['2-byte characters, 240 bytes', 'é'.repeat(120)],
    ['3-byte characters, 255 bytes', '字'.repeat(85)],
    ['4-byte characters (surrogate pairs), 252 bytes', '😀'.repeat(63)],
    ['ASCII, 255 bytes', 'a'.repeat(255)],
    ['mixed, cut inside a character', `${'a'.repeat(199)}字字字`],
  ])('a file name of %s can be uploaded', async (_what, name) => {
    expect(Buffer.byteLength(name)).toBeLessThanOrEqual(MAX_NAME_BYTES);
    const ws = path.join(dir, 'ws');
    const p = path.join(ws, name);
    const data = Buffer.from('hello');
    for (const beneath of [ws, '']) {
      const r = await uploadFile(parts(p, data, beneath));
      expect(r.sizeBytes).toBe(data.length);
      expect(readFileSync(p).equals(data)).toBe(true);
      expect(readdirSync(ws)).toEqual([name]); // no temp file left behind
    }
  });
});
