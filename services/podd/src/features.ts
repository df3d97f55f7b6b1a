/**
 * podd's identity for GetVersion. Callers check features, never version numbers. The strings
 * live in the shared registry (`PODD_FEATURES` of @sandnode/shared); this module only says
 * which of them this podd lists.
 */
import { PODD_FEATURES } from '@sandnode/shared';

/** Component name podd reports. */
export const PODD_COMPONENT = 'podd';

/** Features every podd lists: exec streaming, the file RPCs, confinement of file RPCs (beneath), ForwardPort, ExecStream, the streamed file RPCs. */
export const PODD_BASE_FEATURES: readonly string[] = [
  PODD_FEATURES.exec,
  PODD_FEATURES.files,
  PODD_FEATURES.filesBeneath,
  PODD_FEATURES.forwardPort,
  PODD_FEATURES.execStream,
  PODD_FEATURES.filesStream,
  PODD_FEATURES.filesTree,
];

/**
 * poddFeatures is the feature list of this podd: PODD_BASE_FEATURES, plus "podd.quiesce"
 * (Quiesce / Thaw / GetFreezeStatus) when the host's freeze port existed at start, plus
 * "podd.exec-pty.v1" when pseudo-terminals can be made (koffi loads, /dev/ptmx exists), plus
 * "podd.files.bulk.v1" when it serves a socket it owns (--listen-fd: the bulk channel is sniffed there).
 */
export function poddFeatures(hasFreezePort: boolean, hasPty = false, hasBulk = false): string[] {
  return [...PODD_BASE_FEATURES, ...(hasFreezePort ? [PODD_FEATURES.quiesce] : []), ...(hasPty ? [PODD_FEATURES.execPty] : []), ...(hasBulk ? [PODD_FEATURES.filesBulk] : [])];
}
