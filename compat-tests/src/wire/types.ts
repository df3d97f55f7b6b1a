/** The results of the wire checks (what report.ts turns into a report section). */

/** The value encoded for an enum field that no build defines. */
export const UNKNOWN_ENUM_VALUE = 999;

export type EnumOutcome = 'number' | 'UNRECOGNIZED' | 'threw' | 'other';

/** One enum field decoded with an out-of-range value by one reader. */
export interface WireEnumResult {
  message: string;
  field: string;
  enumType: string;
  /** singular, repeated, map value, oneof */
  shape: string;
  writer: string;
  reader: string;
  outcome: EnumOutcome;
  /** what decode returned (e.g. "999", "-1"), or the exception */
  value: string;
  /** the reader's re-encoding still carries 999 */
  preservedOnReencode: boolean;
  /** what the reader's toJSON prints for the field ("threw: ..." if it threw) */
  json: string;
}

/** The result of one message over every pair of builds. */
export interface WireMessageResult {
  message: string;
  file: string;
  mapEntry: boolean;
  /** "both" (in N and every older build), "new in N", "removed in N", or "partial" (missing in some older builds) */
  scope: 'both' | 'new in N' | 'removed in N' | 'partial';
  result: 'pass' | 'fail';
  /** number of individual round trips / decodes performed */
  checks: number;
  failures: string[];
  notes: string[];
}

export interface WireCompatResult {
  /** build labels, oldest first; the last is N */
  builds: string[];
  messages: WireMessageResult[];
  enums: WireEnumResult[];
  /** problems that are not one message's: descriptor/generated-code disagreements, enum schema changes */
  problems: string[];
  ms: number;
}
