import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import { listDirectory, statBeneath } from './file-list';
import { downloadFile, STREAM_CHUNK_BYTES, UPLOAD_TEMP_MARK, uploadFile, type UploadHeader, type UploadPart } from './file-stream';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

async function collect(it: AsyncIterable<{ data: Buffer; offset: number; sizeBytes: number }>): Promise<{ data: Buffer; size: number; offsets: number[] }> {
  const parts: Buffer[] = [];
  const offsets: number[] = [];
  let size = -1;
  for await (const c of it) {
    if (size < 0) size = c.sizeBytes;
    else {
      offsets.push(c.offset);
      parts.push(c.data);
    }
  }
  return { data: Buffer.concat(parts), size, offsets };
}

/** parts is an upload stream of data after header: cut (an error) after cutAfter bytes; with end false it just stops without its end message. */
async function* parts(h: Partial<UploadHeader> & { path: string }, data: Buffer, chunk = 256 * 1024, cutAfter = Infinity, end: boolean | string = true): AsyncIterable<UploadPart> {
  yield { header: { offset: 0, mode: 0, createParents: false, inPlace: false, beneath: '', ...h } };
  for (let i = 0; i < data.length; i += chunk) {
    if (i >= cutAfter) throw new Error('cut');
    yield { data: data.subarray(i, i + chunk) };
  }
  if (end !== false) yield { end: { sha256: typeof end === 'string' ? end : sha(data) } };
}

describe('podd streamed files (core)', () => {
  let dir: string;
  let ws: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-stream-'));
    ws = path.join(dir, 'workspace');
    mkdirSync(ws);
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test('upload then download a file of several chunks, whole and from an offset', async () => {
    const data = Buffer.alloc(STREAM_CHUNK_BYTES * 2 + 12345);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 11)) & 0xff;
    const p = path.join(ws, 'a/b/f.bin');
    const r = await uploadFile(parts({ path: p, createParents: true, beneath: ws, mode: 0o600 }, data));
    expect(r).toEqual({ sizeBytes: data.length, bytesWritten: data.length, sha256: sha(data) });
    expect(readFileSync(p).equals(data)).toBe(true);
    const whole = await collect(downloadFile(p, 0, ws));
    expect(whole.size).toBe(data.length);
    expect(sha(whole.data)).toBe(sha(data));
    expect(whole.offsets).toEqual([0, STREAM_CHUNK_BYTES, 2 * STREAM_CHUNK_BYTES]);
    const tail = await collect(downloadFile(p, 1_500_000, ws));
    expect(tail.data.equals(data.subarray(1_500_000))).toBe(true);
    const past = await collect(downloadFile(p, data.length + 10, ws));
    expect(past.data.length).toBe(0);
  });

  test('a cut upload at offset 0 leaves the old file and no temp file; an in-place one keeps its bytes and resumes at its size', async () => {
    const p = path.join(ws, 'f');
    writeFileSync(p, 'old');
    const data = Buffer.alloc(1024 * 1024, 1);
    await expect(uploadFile(parts({ path: p, beneath: ws }, data, 64 * 1024, 512 * 1024))).rejects.toThrow('cut');
    expect(readFileSync(p, 'utf8')).toBe('old');
    expect(readdirSync(ws).filter((n) => n.includes(UPLOAD_TEMP_MARK))).toEqual([]);

    await expect(uploadFile(parts({ path: p, beneath: ws, inPlace: true }, data, 64 * 1024, 512 * 1024))).rejects.toThrow('cut');
    expect(readFileSync(p).length).toBe(512 * 1024);
    const rest = await uploadFile(parts({ path: p, beneath: ws, offset: 512 * 1024 }, data.subarray(512 * 1024)));
    expect(rest.sizeBytes).toBe(data.length);
    expect(readFileSync(p).equals(data)).toBe(true);
  });

  test('a stream that stops without its end message (a cut the transport ends quietly) commits nothing', async () => {
    const p = path.join(ws, 'f');
    writeFileSync(p, 'old');
    await expect(uploadFile(parts({ path: p, beneath: ws }, Buffer.alloc(100_000, 2), 10_000, Infinity, false))).rejects.toThrow(/end: the upload stream stopped/);
    expect(readFileSync(p, 'utf8')).toBe('old');
    expect(readdirSync(ws)).toEqual(['f']);
    await expect(uploadFile(parts({ path: p, beneath: ws }, Buffer.alloc(100_000, 2), 10_000, Infinity, 'ab'.repeat(32)))).rejects.toThrow(/end.sha256/);
    expect(readFileSync(p, 'utf8')).toBe('old');
    expect(readdirSync(ws)).toEqual(['f']);
  });

  test('an offset beyond the file, a second header, no header, bad mode are refused', async () => {
    const p = path.join(ws, 'f');
    writeFileSync(p, 'abc');
    await expect(uploadFile(parts({ path: p, beneath: ws, offset: 4 }, Buffer.from('x')))).rejects.toThrow(FailedPreconditionError);
    await expect(uploadFile(parts({ path: path.join(ws, 'nope'), beneath: ws, offset: 4 }, Buffer.from('x')))).rejects.toThrow(FailedPreconditionError);
    async function* twoHeaders(): AsyncIterable<UploadPart> {
      yield* parts({ path: p, beneath: ws }, Buffer.from('x'), 1, Infinity, false);
      yield { header: { path: p, offset: 0, mode: 0, createParents: false, inPlace: false, beneath: ws } };
      yield { end: { sha256: '' } };
    }
    await expect(uploadFile(twoHeaders())).rejects.toThrow(InvalidArgumentError);
    async function* noHeader(): AsyncIterable<UploadPart> {
      yield { data: Buffer.from('x') };
    }
    await expect(uploadFile(noHeader())).rejects.toThrow(InvalidArgumentError);
    await expect(uploadFile(parts({ path: p, beneath: ws, mode: 0o10000 }, Buffer.from('x')))).rejects.toThrow(InvalidArgumentError);
    expect(readFileSync(p, 'utf8')).toBe('abc');
  });

  test('paths with .., NUL, over PATH_MAX or NAME_MAX are INVALID_ARGUMENT', async () => {
    for (const bad of [`${ws}/../etc/passwd`, `${ws}/a\0b`, `${ws}/${'a/'.repeat(2100)}f`, `${ws}/${'n'.repeat(256)}`, 'relative']) {
      await expect(collect(downloadFile(bad, 0, ws))).rejects.toThrow(InvalidArgumentError);
      await expect(uploadFile(parts({ path: bad, beneath: ws }, Buffer.from('x')))).rejects.toThrow(InvalidArgumentError);
      await expect(listDirectory(bad, 0, '', ws)).rejects.toThrow(InvalidArgumentError);
    }
  });

  test('below beneath, a symlink anywhere on the path is refused, never followed', async () => {
    const outside = path.join(dir, 'outside');
    mkdirSync(outside);
    writeFileSync(path.join(outside, 'secret'), 'OUTSIDE');
    symlinkSync(outside, path.join(ws, 'd'));
    symlinkSync(path.join(outside, 'secret'), path.join(ws, 'link'));
    await expect(collect(downloadFile(path.join(ws, 'd/secret'), 0, ws))).rejects.toThrow(FailedPreconditionError);
    await expect(collect(downloadFile(path.join(ws, 'link'), 0, ws))).rejects.toThrow(FailedPreconditionError);
    await expect(uploadFile(parts({ path: path.join(ws, 'd/new'), beneath: ws }, Buffer.from('x')))).rejects.toThrow(FailedPreconditionError);
    await expect(uploadFile(parts({ path: path.join(ws, 'link'), beneath: ws }, Buffer.from('x')))).rejects.toThrow(FailedPreconditionError);
    await expect(uploadFile(parts({ path: path.join(ws, 'd/x/new'), beneath: ws, createParents: true }, Buffer.from('x')))).rejects.toThrow(FailedPreconditionError);
    await expect(listDirectory(path.join(ws, 'd'), 0, '', ws)).rejects.toThrow(FailedPreconditionError);
    await expect(statBeneath(path.join(ws, 'd/secret'), ws)).rejects.toThrow(FailedPreconditionError);
    expect((await statBeneath(path.join(ws, 'd'), ws)).kind).toBe('symlink');
    expect(readdirSync(outside)).toEqual(['secret']);
    expect(readFileSync(path.join(outside, 'secret'), 'utf8')).toBe('OUTSIDE');
    await expect(collect(downloadFile(path.join(ws, 'missing'), 0, ws))).rejects.toThrow(NotFoundError);
  });

  test('a directory swapped for a symlink while files stream never leads outside', async () => {
    const outside = path.join(dir, 'outside');
    mkdirSync(outside);
    writeFileSync(path.join(outside, 'secret'), 'OUTSIDE');
    const d = path.join(ws, 'd');
    mkdirSync(d);
    writeFileSync(path.join(d, 'secret'), 'inside');
    let stop = false;
    // the swapper flips d between the real directory and a symlink to outside, as fast as it can
    const swapper = (async () => {
      let n = 0;
      while (!stop) {
        renameSync(d, `${d}.real`);
        symlinkSync(outside, d);
        if (++n % 16 === 0) await new Promise((r) => setImmediate(r));
        rmSync(d);
        renameSync(`${d}.real`, d);
      }
    })();
    const seen = new Set<string>();
    try {
      for (let i = 0; i < 300; i++) {
        try {
          seen.add((await collect(downloadFile(path.join(d, 'secret'), 0, ws))).data.toString());
        } catch (err) {
          seen.add((err as Error).constructor.name);
        }
        try {
          await uploadFile(parts({ path: path.join(d, `up${i}`), beneath: ws }, Buffer.from('data')));
        } catch {
          // refused: fine
        }
      }
    } finally {
      stop = true;
      await swapper;
    }
    expect(seen.has('OUTSIDE')).toBe(false);
    expect(readdirSync(outside)).toEqual(['secret']);
  });

  test('a listing of 2500 entries comes in ordered pages that cover each name once', async () => {
    const d = path.join(ws, 'many');
    mkdirSync(d);
    for (let i = 0; i < 2500; i++) writeFileSync(path.join(d, `f${String(i).padStart(5, '0')}`), '');
    symlinkSync('/', path.join(d, 'zlink'));
    const names: string[] = [];
    let token = '';
    let pages = 0;
    do {
      const page = await listDirectory(d, 1000, token, ws);
      expect(page.entries.length).toBeLessThanOrEqual(1000);
      names.push(...page.entries.map((e) => e.name));
      token = page.nextPageToken;
      pages++;
    } while (token);
    expect(pages).toBe(3);
    expect(names.length).toBe(2501);
    expect(names).toEqual([...names].sort());
    expect((await listDirectory(d, 1, encodeTokenOf('zk'), ws)).entries.map((e) => [e.name, e.kind])).toEqual([['zlink', 'symlink']]);
    await expect(listDirectory(d, 1001, '', ws)).rejects.toThrow(InvalidArgumentError);
    await expect(listDirectory(d, 10, '!!bad', ws)).rejects.toThrow(InvalidArgumentError);
    await expect(listDirectory(path.join(d, 'f00001'), 10, '', ws)).rejects.toThrow(FailedPreconditionError);
    expect(existsSync(d)).toBe(true);
  });
});

function encodeTokenOf(name: string): string {
  return Buffer.from(name).toString('base64url');
}
