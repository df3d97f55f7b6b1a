/**
 * API tokens of the public TCP listener (issue 10 §4), in the `tokens` table of records.db, so
 * every server of the node (the next one after a handover too) checks the same tokens, and a
 * revocation holds on the next call of every connection. A token's secret is 32 random bytes
 * (base64url, prefix "sn_"); only its sha256 is stored, and the secret is shown once by
 * CreateToken.
 *
 * The table is made when missing (the migration from a records.db without tokens; meta
 * `tokens_schema` = 1). A row that cannot be trusted (an id, name or role that is not one, a
 * hash that is not 32 bytes, times that are not whole ms) is moved to the `quarantine` table
 * (key `token:<id>`, the row as JSON) with the reason and logged, at open and when a call
 * meets it: it never authenticates anyone and never stops the node.
 */
import { createHash, randomBytes } from 'node:crypto';
import type Database from 'better-sqlite3';
import { AlreadyExistsError, busyToUnavailable, InvalidArgumentError, NotFoundError, UnauthenticatedError, type Logger, type Role, type TokenIdentity } from '@sandnode/shared';

/** A token as listed (never its secret). Times in ms since the epoch; 0 = never / not revoked. */
export interface ApiTokenInfo {
  id: string;
  name: string;
  role: Role;
  createdAtMs: number;
  expiresAtMs: number;
  revokedAtMs: number;
}

/** Longest ttl a token may get, ms (10 years). */
export const MAX_TOKEN_TTL_MS = 10 * 365 * 86_400_000;
const NAME_RE = /^[A-Za-z0-9._-]{1,64}$/;
const ID_RE = /^tok_[0-9a-f]{16}$/;
const ROLES: readonly string[] = ['admin', 'read'];

interface Row {
  id: unknown;
  name: unknown;
  role: unknown;
  secret_sha256: unknown;
  created_at_ms: unknown;
  expires_at_ms: unknown;
  revoked_at_ms: unknown;
}

const sha256 = (s: string) => createHash('sha256').update(s, 'utf8').digest();
const wholeMs = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/** rowProblem: the token a row holds, or why it cannot be trusted. */
function rowProblem(r: Row): ApiTokenInfo | string {
  if (typeof r.id !== 'string' || !ID_RE.test(r.id)) return `id ${JSON.stringify(r.id)} is not a token id`;
  if (typeof r.name !== 'string' || !NAME_RE.test(r.name)) return `name ${JSON.stringify(r.name)} is not a token name`;
  if (typeof r.role !== 'string' || !ROLES.includes(r.role)) return `role ${JSON.stringify(r.role)} is not admin or read`;
  if (!(r.secret_sha256 instanceof Uint8Array) || r.secret_sha256.length !== 32) return 'secret_sha256 is not 32 bytes';
  for (const k of ['created_at_ms', 'expires_at_ms', 'revoked_at_ms'] as const) if (!wholeMs(r[k])) return `${k} is not a whole number of ms`;
  return { id: r.id, name: r.name, role: r.role as Role, createdAtMs: r.created_at_ms as number, expiresAtMs: r.expires_at_ms as number, revokedAtMs: r.revoked_at_ms as number };
}

export class SqliteTokenStore {
  /** the statement of verify, prepared once (it runs on every TCP call) */
  private readonly bySecret: Database.Statement<[Buffer], Row>;
  /**
   * Makes the tables when missing and sets aside the rows that cannot be trusted.
   * setAside(key, reason) is told of each (the record store's quarantine map).
   */
  constructor(
    private readonly db: Database.Database,
    private readonly log: Logger,
    private readonly setAside: (key: string, reason: string) => void = () => undefined,
  ) {
    db.exec(`
      CREATE TABLE IF NOT EXISTS tokens (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        secret_sha256 BLOB NOT NULL,
        created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL DEFAULT 0,
        revoked_at_ms INTEGER NOT NULL DEFAULT 0
      );
      CREATE UNIQUE INDEX IF NOT EXISTS tokens_live_name ON tokens(name) WHERE revoked_at_ms = 0;
      CREATE INDEX IF NOT EXISTS tokens_secret ON tokens(secret_sha256);
      INSERT OR IGNORE INTO meta (key, value) VALUES ('tokens_schema', '1');
    `);
    this.bySecret = db.prepare<[Buffer], Row>('SELECT * FROM tokens WHERE secret_sha256 = ?');
    for (const r of this.db.prepare<[], Row>('SELECT * FROM tokens').all()) this.trusted(r);
  }

  /** trusted: the row's token, or undefined after moving the row to quarantine. */
  private trusted(r: Row): ApiTokenInfo | undefined {
    const t = rowProblem(r);
    if (typeof t !== 'string') return t;
    const key = `token:${String(r.id).slice(0, 80)}`;
    this.log.error({ key, reason: t }, 'token row set aside: it authenticates no one');
    try {
      const json = JSON.stringify({ ...r, secret_sha256: r.secret_sha256 instanceof Uint8Array ? Buffer.from(r.secret_sha256).toString('hex') : r.secret_sha256 });
      this.db.transaction(() => {
        this.db
          .prepare('INSERT INTO quarantine (rowid_was, sandbox_id, reason, quarantined_at_ms, record) SELECT rowid, ?, ?, ?, ? FROM tokens WHERE id IS ?')
          .run(key, t, Date.now(), Buffer.from(json), r.id);
        this.db.prepare('DELETE FROM tokens WHERE id IS ?').run(r.id);
      })();
    } catch (err) {
      this.log.warn({ key, err }, 'could not move a token row to quarantine (it is still not trusted)');
    }
    this.setAside(key, t);
    return undefined;
  }

  /**
   * create makes a token; the secret is returned once. Errors: InvalidArgumentError (name,
   * role, ttlMs), AlreadyExistsError (a live token has this name), StoreBusyError.
   */
  create(req: { name: string; role: Role; ttlMs: number }, nowMs = Date.now()): { token: ApiTokenInfo; secret: string } {
    if (!NAME_RE.test(req.name)) throw new InvalidArgumentError(`name: ${JSON.stringify(req.name.slice(0, 80))} is not 1..64 characters of [A-Za-z0-9._-]; nothing was made`);
    if (!ROLES.includes(req.role)) throw new InvalidArgumentError('role: must be admin or read; nothing was made');
    if (!Number.isSafeInteger(req.ttlMs) || req.ttlMs < 0 || req.ttlMs > MAX_TOKEN_TTL_MS) throw new InvalidArgumentError(`ttl_ms: ${req.ttlMs} is not 0..${MAX_TOKEN_TTL_MS} ms; nothing was made`);
    const secret = `sn_${randomBytes(32).toString('base64url')}`;
    const token: ApiTokenInfo = { id: `tok_${randomBytes(8).toString('hex')}`, name: req.name, role: req.role, createdAtMs: nowMs, expiresAtMs: req.ttlMs ? nowMs + req.ttlMs : 0, revokedAtMs: 0 };
    busyToUnavailable('records.db: token create', () => {
      try {
        this.db
          .prepare('INSERT INTO tokens (id, name, role, secret_sha256, created_at_ms, expires_at_ms, revoked_at_ms) VALUES (?, ?, ?, ?, ?, ?, 0)')
          .run(token.id, token.name, token.role, sha256(secret), token.createdAtMs, token.expiresAtMs);
      } catch (err) {
        if ((err as { code?: string }).code === 'SQLITE_CONSTRAINT_UNIQUE') throw new AlreadyExistsError(`a token named ${token.name} exists (revoke it first); nothing was made`);
        throw err;
      }
    });
    this.log.info({ token_id: token.id, name: token.name, role: token.role, expires_at_ms: token.expiresAtMs }, 'token created');
    return { token, secret };
  }

  /** list: every trusted token by name then id (revoked and expired ones too). */
  list(): ApiTokenInfo[] {
    const rows = busyToUnavailable('records.db: token list', () => this.db.prepare<[], Row>('SELECT * FROM tokens ORDER BY name, id').all());
    return rows.flatMap((r) => this.trusted(r) ?? []);
  }

  /**
   * revoke marks the token nameOrId revoked: the live token of that name, else the token with
   * that id, else the last revoked token of that name (so revoking by name twice answers like
   * by id). A revoked one is answered unchanged. Errors: InvalidArgumentError (empty), NotFoundError.
   */
  revoke(nameOrId: string, nowMs = Date.now()): ApiTokenInfo {
    if (!nameOrId) throw new InvalidArgumentError('name_or_id: empty; nothing was revoked');
    const all = this.list();
    const lastRevoked = all.filter((x) => x.name === nameOrId).sort((a, b) => b.revokedAtMs - a.revokedAtMs || b.createdAtMs - a.createdAtMs)[0];
    const t = all.find((x) => x.name === nameOrId && x.revokedAtMs === 0) ?? all.find((x) => x.id === nameOrId) ?? lastRevoked;
    if (!t) throw new NotFoundError(`no token named or with id ${JSON.stringify(nameOrId.slice(0, 80))}`);
    if (t.revokedAtMs) return t;
    busyToUnavailable('records.db: token revoke', () => this.db.prepare('UPDATE tokens SET revoked_at_ms = ? WHERE id = ? AND revoked_at_ms = 0').run(nowMs, t.id));
    this.log.info({ token_id: t.id, name: t.name }, 'token revoked');
    return { ...t, revokedAtMs: nowMs };
  }

  /**
   * verify: who the secret is, checked now (every call). Errors: UnauthenticatedError (no such
   * token, a row set aside, revoked, expired), StoreBusyError (UNAVAILABLE).
   */
  verify(secret: string, nowMs = Date.now()): TokenIdentity {
    const r = busyToUnavailable('records.db: token check', () => this.bySecret.get(sha256(secret)));
    const t = r && this.trusted(r);
    if (!t) throw new UnauthenticatedError('the bearer token is not known to this node; nothing was done');
    if (t.revokedAtMs) throw new UnauthenticatedError(`token ${t.name} (${t.id}) was revoked; nothing was done`);
    if (t.expiresAtMs && nowMs >= t.expiresAtMs) throw new UnauthenticatedError(`token ${t.name} (${t.id}) expired ${nowMs - t.expiresAtMs} ms ago; nothing was done`);
    return { name: t.name, role: t.role };
  }
}
