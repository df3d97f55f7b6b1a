// Attacker finding (fixed).
// A pools row whose key is a BLOB (sqlite3: INSERT ... VALUES (X'FF00', ...)): better-sqlite3
// returns a new Buffer on every read, so SqlitePoolStore.warned (a Set keyed by the key) never
// matches and the "warm pool row skipped" error is logged on every list, i.e. on every pool tick
// and claim (about twice a second on an idle node: 124 lines in 20 s here), instead of once.
import Database from 'better-sqlite3';
import type { Logger } from '@sandnode/shared';
import { SqlitePoolStore } from './sqlite-pool-store';

it('a row with a BLOB key is logged once, however often the pools are listed', () => {
  const db = new Database(':memory:');
  const error = jest.fn();
  const log = { error, warn: jest.fn(), info: jest.fn(), debug: jest.fn(), child: () => log } as unknown as Logger;
  const store = new SqlitePoolStore(db, log);
  db.exec(`INSERT INTO pools VALUES (X'FF00', 'x', 1, '', 0)`);
  for (let i = 0; i < 10; i++) expect(store.list()).toEqual([]);
  expect(error).toHaveBeenCalledTimes(1);
  expect(store.skippedRows()).toHaveLength(1);
  db.close();
});
