/**
 * API tokens in records.db (issue 10 §4) on a real SQLite file: the secret is shown once and
 * only its sha256 is stored; verify answers the role, and UNAUTHENTICATED for an unknown,
 * revoked (at once, through a second connection to the same file: the next server of a
 * handover) or expired token; a row that cannot be trusted is moved to quarantine at open,
 * authenticates no one and does not stop the store.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger, isCode, Status } from '@sandnode/shared';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');
const code = (fn: () => unknown): Status | 'ok' => {
  try {
    fn();
    return 'ok';
  } catch (err) {
    for (const c of [Status.UNAUTHENTICATED, Status.INVALID_ARGUMENT, Status.ALREADY_EXISTS, Status.NOT_FOUND]) if (isCode(err, c)) return c;
    throw err;
  }
};

describe('SqliteTokenStore', () => {
  let dir: string;
  let file: string;
  let store: SqliteRecordStore;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-tokens-'));
    file = path.join(dir, 'records.db');
    store = new SqliteRecordStore(file, log);
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('keeps only the sha256 of a secret shown once; verify gives the name and role', () => {
    const { token, secret } = store.tokens().create({ name: 'ci', role: 'read', ttlMs: 0 });
    expect(secret).toMatch(/^sn_[A-Za-z0-9_-]{43}$/);
    expect(token).toMatchObject({ name: 'ci', role: 'read', expiresAtMs: 0, revokedAtMs: 0 });
    const db = new Database(file, { readonly: true });
    const row = db.prepare<[], { secret_sha256: Buffer }>('SELECT secret_sha256 FROM tokens').get()!;
    const dump = JSON.stringify(db.prepare('SELECT * FROM tokens').all());
    db.close();
    expect(row.secret_sha256.equals(createHash('sha256').update(secret).digest())).toBe(true);
    expect(dump).not.toContain(secret.slice(3));
    expect(store.tokens().verify(secret)).toEqual({ name: 'ci', role: 'read' });
    expect(code(() => store.tokens().verify(`${secret}x`))).toBe(Status.UNAUTHENTICATED);
    expect(
      store
        .tokens()
        .list()
        .map((t) => t.name),
    ).toEqual(['ci']);
  });

  it('refuses bad input and a second live token of one name, changing nothing', () => {
    expect(code(() => store.tokens().create({ name: '', role: 'admin', ttlMs: 0 }))).toBe(Status.INVALID_ARGUMENT);
    expect(code(() => store.tokens().create({ name: 'a b', role: 'admin', ttlMs: 0 }))).toBe(Status.INVALID_ARGUMENT);
    expect(code(() => store.tokens().create({ name: 'a', role: 'root' as never, ttlMs: 0 }))).toBe(Status.INVALID_ARGUMENT);
    expect(code(() => store.tokens().create({ name: 'a', role: 'admin', ttlMs: -1 }))).toBe(Status.INVALID_ARGUMENT);
    store.tokens().create({ name: 'a', role: 'admin', ttlMs: 0 });
    expect(code(() => store.tokens().create({ name: 'a', role: 'read', ttlMs: 0 }))).toBe(Status.ALREADY_EXISTS);
    expect(store.tokens().list()).toHaveLength(1);
  });

  it('a revoke holds at once for another connection to the same file (the next server), by name or id; a revoked name can be made again', () => {
    const a = store.tokens().create({ name: 'ops', role: 'admin', ttlMs: 0 });
    const other = new SqliteRecordStore(file, log); // as the standby after a handover opens it
    try {
      expect(other.tokens().verify(a.secret).role).toBe('admin');
      store.tokens().revoke('ops');
      expect(code(() => other.tokens().verify(a.secret))).toBe(Status.UNAUTHENTICATED);
      expect(code(() => store.tokens().revoke('nope'))).toBe(Status.NOT_FOUND);
      expect(store.tokens().revoke(a.token.id).revokedAtMs).toBeGreaterThan(0); // again: unchanged
      const b = other.tokens().create({ name: 'ops', role: 'read', ttlMs: 0 });
      expect(store.tokens().verify(b.secret).role).toBe('read');
      expect(code(() => store.tokens().verify(a.secret))).toBe(Status.UNAUTHENTICATED);
    } finally {
      other.close();
    }
  });

  it('revoking a revoked token by name answers it unchanged, as by id (not NOT_FOUND); the last revoked of a name', () => {
    const first = store.tokens().create({ name: 'ci', role: 'read', ttlMs: 0 }, 1_000);
    store.tokens().revoke('ci', 2_000);
    const second = store.tokens().create({ name: 'ci', role: 'read', ttlMs: 0 }, 3_000);
    store.tokens().revoke('ci', 4_000);
    const again = store.tokens().revoke('ci', 5_000);
    expect(again).toMatchObject({ id: second.token.id, revokedAtMs: 4_000 });
    expect(store.tokens().revoke(first.token.id, 6_000)).toMatchObject({ id: first.token.id, revokedAtMs: 2_000 });
    expect(
      store
        .tokens()
        .list()
        .map((t) => t.revokedAtMs)
        .sort(),
    ).toEqual([2_000, 4_000]);
  });

  it('an expired token is UNAUTHENTICATED', () => {
    const t = store.tokens().create({ name: 'short', role: 'admin', ttlMs: 1000 }, 1_000_000);
    expect(store.tokens().verify(t.secret, 1_000_999).role).toBe('admin');
    expect(code(() => store.tokens().verify(t.secret, 1_001_000))).toBe(Status.UNAUTHENTICATED);
  });

  it('a row that cannot be trusted is quarantined at open and authenticates no one; the good ones still work', () => {
    const good = store.tokens().create({ name: 'good', role: 'read', ttlMs: 0 });
    const evil = 'sn_evil';
    store.close();
    const db = new Database(file);
    db.prepare('INSERT INTO tokens (id, name, role, secret_sha256, created_at_ms) VALUES (?, ?, ?, ?, 0)').run('tok_00000000000000ff', 'evil', 'root', createHash('sha256').update(evil).digest());
    db.prepare('INSERT INTO tokens (id, name, role, secret_sha256, created_at_ms) VALUES (?, ?, ?, ?, 0)').run('tok_00000000000000fe', 'short', 'admin', Buffer.from('abc'));
    db.close();
    store = new SqliteRecordStore(file, log);
    expect(
      store
        .tokens()
        .list()
        .map((t) => t.name),
    ).toEqual(['good']);
    expect(code(() => store.tokens().verify(evil))).toBe(Status.UNAUTHENTICATED);
    expect(store.tokens().verify(good.secret).role).toBe('read');
    const q = store.quarantinedRows().map((r) => r.key);
    expect(q).toEqual(expect.arrayContaining(['token:tok_00000000000000ff', 'token:tok_00000000000000fe']));
    expect(store.quarantinedIds()).toEqual([]); // not sandbox ids: the orphan sweep never sees them
  });
});
