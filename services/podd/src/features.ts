/**
 * podd's identity for GetVersion. Callers check features, never version numbers. The strings
 * live in the shared registry (`PODD_FEATURES` of @sandnode/shared); this module only says
 * which of them this podd lists.
 */
import { PODD_FEATURES } from '@sandnode/shared';

/** Component name podd reports. */
export const PODD_COMPONENT = 'podd';

/** Features every podd lists: exec streaming, the file RPCs, confinement of file RPCs (beneath), ForwardPort, the streamed file RPCs. */
export const PODD_BASE_FEATURES: readonly string[] = [PODD_FEATURES.exec, PODD_FEATURES.files, PODD_FEATURES.filesBeneath, PODD_FEATURES.forwardPort, PODD_FEATURES.filesStream];

/**
 * poddFeatures is the feature list of this podd: PODD_BASE_FEATURES, plus "podd.quiesce"
 * (Quiesce / Thaw / GetFreezeStatus) when the host's freeze port existed at start.
 */
export function poddFeatures(hasFreezePort: boolean): string[] {
  return hasFreezePort ? [...PODD_BASE_FEATURES, PODD_FEATURES.quiesce] : [...PODD_BASE_FEATURES];
}
