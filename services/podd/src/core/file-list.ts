/**
 * Directory listing and confined stat of podd (ListDirectory, Stat with beneath; feature
 * "podd.files.stream.v1"). Entries are described with lstat (a symlink is described, never
 * followed) through the directory's fd (walk.ts), ordered by the bytes of their names, and
 * paged: a page token is the last name of the previous page, so a page costs one readdir and
 * at most page-size lstats, whatever the directory's size.
 */
import type { Stats } from 'node:fs';
import { lstat, readdir, readlink } from 'node:fs/promises';
import { InvalidArgumentError } from '@sandnode/shared';
import { fsError, type FileKind } from './files';
import { at, checkStreamPath, walkDir, walkParent } from './walk';

/** Entries per ListDirectory page when the request says 0. */
export const DEFAULT_LIST_PAGE_SIZE = 1000;
/** Most entries per ListDirectory page (at most 1000 names of at most 255 bytes: well below the message limit). */
export const MAX_LIST_PAGE_SIZE = 1000;

/** One directory entry (or a stat answer). */
export interface EntryInfo {
  name: string;
  kind: FileKind;
  /** bytes */
  sizeBytes: number;
  /** mode & 0o7777 */
  mode: number;
  /** Unix epoch ms (whole ms) */
  mtimeMs: number;
  /** a symlink's target (readlink through the directory's fd; kind symlink only) */
  linkTarget?: string;
}

/** One page of a listing. */
export interface ListPage {
  entries: EntryInfo[];
  /** '' on the last page */
  nextPageToken: string;
}

function describe(name: string, st: Stats): EntryInfo {
  const kind: FileKind = st.isFile() ? 'regular' : st.isDirectory() ? 'directory' : st.isSymbolicLink() ? 'symlink' : 'other';
  return { name, kind, sizeBytes: st.size, mode: st.mode & 0o7777, mtimeMs: Math.floor(st.mtimeMs) };
}

/** encodeToken / decodeToken: a page token is the last name of a page, base64url. */
export function encodeToken(name: string): string {
  return Buffer.from(name).toString('base64url');
}

function decodeToken(token: string): string {
  const name = Buffer.from(token, 'base64url').toString();
  if (!name || name.includes('/') || name.includes('\0') || encodeToken(name) !== token) throw new InvalidArgumentError('page_token: not a token of this listing');
  return name;
}

/**
 * listDirectory returns one page (pageSize entries; 0 = DEFAULT_LIST_PAGE_SIZE) of directory
 * p after pageToken. An entry removed between readdir and its lstat is left out. Errors:
 * INVALID_ARGUMENT (path, page size above MAX_LIST_PAGE_SIZE, bad token), NOT_FOUND,
 * FAILED_PRECONDITION (not a directory, a symlink on the way below beneath).
 */
export async function listDirectory(p: string, pageSize: number, pageToken: string, beneath: string): Promise<ListPage> {
  checkStreamPath(p);
  if (!Number.isInteger(pageSize) || pageSize < 0 || pageSize > MAX_LIST_PAGE_SIZE) throw new InvalidArgumentError(`page_size: ${pageSize}, at most ${MAX_LIST_PAGE_SIZE}`);
  const size = pageSize || DEFAULT_LIST_PAGE_SIZE;
  const after = pageToken ? Buffer.from(decodeToken(pageToken)) : undefined;
  const dir = await walkDir(p, beneath);
  try {
    let names: string[];
    try {
      names = await readdir(`/proc/self/fd/${dir.fd}`);
    } catch (err) {
      throw fsError(err, p, 'list');
    }
    const sorted = names.map((n) => Buffer.from(n)).filter((b) => !after || Buffer.compare(b, after) > 0);
    sorted.sort(Buffer.compare);
    const entries: EntryInfo[] = [];
    let more = false;
    for (const b of sorted) {
      if (entries.length >= size) {
        more = true;
        break;
      }
      const name = b.toString();
      try {
        const e = describe(name, await lstat(at(dir.fd, name)));
        if (e.kind === 'symlink') e.linkTarget = await readlink(at(dir.fd, name));
        entries.push(e);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        // gone (ENOENT) or no longer a symlink (EINVAL of readlink) since readdir: left out
        if (code !== 'ENOENT' && code !== 'EINVAL') throw fsError(err, `${p}/${name}`, 'stat');
      }
    }
    const last = entries.at(-1);
    return { entries, nextPageToken: more && last ? encodeToken(last.name) : '' };
  } finally {
    await dir.close();
  }
}

/**
 * statBeneath describes p without following a final symlink, walking below beneath without
 * following any symlink on the way. Errors: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION.
 */
export async function statBeneath(p: string, beneath: string): Promise<EntryInfo> {
  checkStreamPath(p);
  const w = await walkParent(p, beneath);
  try {
    const st = w.name ? await lstat(at(w.dir.fd, w.name)) : await w.dir.stat();
    return describe(w.name || p, st);
  } catch (err) {
    throw fsError(err, p, 'stat');
  } finally {
    await w.release();
  }
}
