/**
 * checkSchemas: every message of every build, each older build paired with N (the last), the
 * checks of checks.ts in both directions; a message only in N runs them against N alone.
 */
import type { Build } from '../releases';
import { crossCheck, enumCheck, enumSchemaProblems, schemaCheck, unknownCheck } from './checks';
import { loadSchema } from './codegen';
import type { Schema } from './schema';
import type { WireCompatResult, WireEnumResult, WireMessageResult } from './types';

/**
 * checkWire loads every build (oldest first; the last is N) and runs checkSchemas. Throws only
 * when a build's descriptor set cannot be read (the message names the file).
 */
export function checkWire(builds: Build[]): WireCompatResult {
  if (builds.length === 0) throw new Error('checkWire: no builds');
  return checkSchemas(builds.map((b) => loadSchema(b)));
}

/** checkSchemas is checkWire on loaded schemas (oldest first; the last is N). */
export function checkSchemas(schemas: Schema[]): WireCompatResult {
  const t0 = Date.now();
  const n = schemas[schemas.length - 1]!;
  const older = schemas.slice(0, -1);
  const problems: string[] = [];
  for (const s of schemas) problems.push(...s.problems.map((p) => `${s.build.label}: ${p}`));
  for (const o of older) problems.push(...enumSchemaProblems(o, n));

  const names = new Set<string>([...n.messages.keys()]);
  for (const o of older) for (const k of o.messages.keys()) names.add(k);
  const messages: WireMessageResult[] = [];
  const enums: WireEnumResult[] = [];
  for (const name of [...names].sort()) {
    const inN = n.messages.get(name);
    const inOld = older.filter((o) => o.messages.has(name));
    const any = (inN ?? inOld[0]!.messages.get(name))!;
    const res: WireMessageResult = {
      message: name,
      file: any.file,
      mapEntry: any.isMapEntry,
      scope: !inN ? 'removed in N' : inOld.length === older.length && older.length > 0 ? 'both' : inOld.length === 0 ? 'new in N' : 'partial',
      result: 'pass',
      checks: 0,
      failures: [],
      notes: [],
    };
    const usable = (s: Schema) => s.codecs.has(name);
    if (!inN) {
      res.failures.push(`in ${inOld.map((o) => o.build.label).join(', ')} but not in N: a message is never removed`);
    } else if (!usable(n)) {
      res.failures.push(`N has no generated codec for it`);
    } else {
      if (res.scope === 'partial')
        res.notes.push(
          `not in ${older
            .filter((o) => !o.messages.has(name))
            .map((o) => o.build.label)
            .join(', ')}: checked against N alone there`,
        );
      // N alone: round trip, unknown fields, unknown enums (for every message; the only checks for "new in N").
      crossCheck(n, n, name, res);
      unknownCheck(n, n, name, res);
      enumCheck(n, n, name, res, enums);
      for (const o of inOld) {
        if (!usable(o)) {
          res.failures.push(`${o.build.label} has no generated codec for it`);
          continue;
        }
        schemaCheck(o, n, name, res);
        crossCheck(o, n, name, res);
        crossCheck(n, o, name, res);
        unknownCheck(o, o, name, res);
        unknownCheck(n, o, name, res);
        unknownCheck(o, n, name, res);
        enumCheck(n, o, name, res, enums);
        enumCheck(o, n, name, res, enums);
      }
    }
    res.result = res.failures.length ? 'fail' : 'pass';
    messages.push(res);
  }
  return { builds: schemas.map((s) => s.build.label), messages, enums, problems, ms: Date.now() - t0 };
}
