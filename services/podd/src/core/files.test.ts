import nodeFs, { mkdtempSync, rmSync, symlinkSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import { readFile, statPath, writeFile } from './files';
import { MAX_FILE_BYTES } from './limits';

describe('podd core files', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-files-'));
  });
  afterEach(() => {
    jest.restoreAllMocks();
    rmSync(dir, { recursive: true, force: true });
  });

  test('write fsyncs the file and, on create, the parent dirs it changed', async () => {
    const fh = await open(dir, 'r');
    const proto = Object.getPrototypeOf(fh) as { sync: () => Promise<void> };
    await fh.close();
    const synced: number[] = [];
    const orig = proto.sync;
    jest.spyOn(proto, 'sync').mockImplementation(function (this: { fd: number }) {
      synced.push(this.fd);
      return orig.call(this);
    });
    await writeFile(path.join(dir, 'a/b/c.txt'), Buffer.from('x'), { createParents: true });
    // file + dir (a/b gets the file) + dir (a gets b) + tmp dir (gets a)
    expect(synced.length).toBe(4);
    synced.length = 0;
    await writeFile(path.join(dir, 'a/b/c.txt'), Buffer.from('yy'));
    expect(synced.length).toBe(1); // existing file: only the file
  });

  test('replace, append, mode on create, exact bits whatever the umask', async () => {
    const p = path.join(dir, 'f');
    expect(await writeFile(p, Buffer.from('hello world'), { mode: 0o600 })).toEqual({ sizeBytes: 11 });
    expect(statSync(p).mode & 0o7777).toBe(0o600);
    expect(await writeFile(p, Buffer.from('hi'))).toEqual({ sizeBytes: 2 });
    expect(await writeFile(p, Buffer.from('!'), { append: true, mode: 0o777 })).toEqual({ sizeBytes: 3 });
    expect(readFileSync(p, 'utf8')).toBe('hi!');
    expect(statSync(p).mode & 0o7777).toBe(0o600); // mode applies to new files only
    await writeFile(path.join(dir, 'g'), Buffer.alloc(0));
    expect(statSync(path.join(dir, 'g')).mode & 0o7777).toBe(0o644);
  });

  test('read at offset, eof and size', async () => {
    const p = path.join(dir, 'f');
    await writeFile(p, Buffer.from('0123456789'));
    expect(await readFile(p, 0, 0)).toEqual({ data: Buffer.from('0123456789'), sizeBytes: 10, eof: true });
    expect(await readFile(p, 2, 3)).toEqual({ data: Buffer.from('234'), sizeBytes: 10, eof: false });
    expect(await readFile(p, 7, 3)).toEqual({ data: Buffer.from('789'), sizeBytes: 10, eof: true });
    expect(await readFile(p, 20, 3)).toEqual({ data: Buffer.alloc(0), sizeBytes: 10, eof: true });
  });

  test('errors name the field and carry the contract code', async () => {
    await expect(readFile('rel/path', 0, 0)).rejects.toThrow(InvalidArgumentError);
    await expect(readFile('rel/path', 0, 0)).rejects.toThrow(/^path/);
    await expect(readFile(path.join(dir, 'x'), 0, MAX_FILE_BYTES + 1)).rejects.toThrow(/^length/);
    await expect(readFile(path.join(dir, 'missing'), 0, 0)).rejects.toThrow(NotFoundError);
    await expect(readFile(dir, 0, 0)).rejects.toThrow(FailedPreconditionError);
    await expect(writeFile(dir, Buffer.from('x'))).rejects.toThrow(FailedPreconditionError);
    await expect(writeFile(path.join(dir, 'no/parent'), Buffer.from('x'))).rejects.toThrow(NotFoundError);
    await expect(writeFile(path.join(dir, 'big'), Buffer.alloc(MAX_FILE_BYTES + 1))).rejects.toThrow(/^data/);
    await expect(writeFile(path.join(dir, 'm'), Buffer.from('x'), { mode: 0o17777 })).rejects.toThrow(/^mode/);
    await writeFile(path.join(dir, 'file'), Buffer.from('x'));
    await expect(writeFile(path.join(dir, 'file/sub'), Buffer.from('x'), { createParents: true })).rejects.toThrow(FailedPreconditionError);
    await expect(statPath('relative')).rejects.toThrow(InvalidArgumentError);
    await expect(statPath(path.join(dir, 'missing'))).rejects.toThrow(NotFoundError);
  });

  test('stat does not follow a final symlink', async () => {
    mkdirSync(path.join(dir, 'd'));
    symlinkSync('d', path.join(dir, 'l'));
    await writeFile(path.join(dir, 'f'), Buffer.from('abc'), { mode: 0o640 });
    expect((await statPath(path.join(dir, 'l'))).kind).toBe('symlink');
    expect((await statPath(path.join(dir, 'd'))).kind).toBe('directory');
    const f = await statPath(path.join(dir, 'f'));
    expect(f).toMatchObject({ kind: 'regular', sizeBytes: 3, mode: 0o640 });
    expect(Math.abs(f.mtimeMs - Date.now())).toBeLessThan(10_000);
  });
});

describe('confinement (beneath)', () => {
  const fs = nodeFs;
  const os = { tmpdir };
  const p = path;
  const rf = readFile;
  const wf = writeFile;
  let root: string;
  let outside: string;
  beforeAll(() => {
    root = fs.mkdtempSync(p.join(os.tmpdir(), 'beneath-'));
    outside = fs.mkdtempSync(p.join(os.tmpdir(), 'outside-'));
    fs.mkdirSync(p.join(root, 'ws'));
    fs.writeFileSync(p.join(outside, 'secret'), 'secret');
    fs.writeFileSync(p.join(root, 'ws', 'ok'), 'ok');
    fs.symlinkSync(p.join(outside, 'secret'), p.join(root, 'ws', 'link'));
    fs.symlinkSync(outside, p.join(root, 'ws', 'dirlink'));
    fs.symlinkSync('ok', p.join(root, 'ws', 'inner'));
  });
  afterAll(() => {
    fs.rmSync(root, { recursive: true, force: true });
    fs.rmSync(outside, { recursive: true, force: true });
  });

  it('reads inside, also through a symlink that stays inside', async () => {
    const ws = p.join(root, 'ws');
    expect(Buffer.from((await rf(p.join(ws, 'ok'), 0, 0, ws)).data).toString()).toBe('ok');
  });
  it('refuses reads that resolve outside', async () => {
    const ws = p.join(root, 'ws');
    await expect(rf(p.join(ws, 'link'), 0, 0, ws)).rejects.toThrow(/outside/);
    await expect(rf(p.join(ws, 'dirlink', 'secret'), 0, 0, ws)).rejects.toThrow(/outside/);
  });
  it('refuses writes below a symlinked dir or onto a symlink, and writes nothing', async () => {
    const ws = p.join(root, 'ws');
    await expect(wf(p.join(ws, 'dirlink', 'evil'), Buffer.from('x'), { beneath: ws })).rejects.toThrow(/outside/);
    await expect(wf(p.join(ws, 'link'), Buffer.from('x'), { beneath: ws, append: true })).rejects.toThrow(/symlink/);
    expect(fs.existsSync(p.join(outside, 'evil'))).toBe(false);
    expect(fs.readFileSync(p.join(outside, 'secret'), 'utf8')).toBe('secret');
    await wf(p.join(ws, 'new', 'file'), Buffer.from('y'), { beneath: ws, createParents: true });
    expect(fs.readFileSync(p.join(ws, 'new', 'file'), 'utf8')).toBe('y');
  });
});
