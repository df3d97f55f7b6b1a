/** podd's identity for GetVersion. Callers check features, never version numbers. */

/** Component name podd reports. */
export const PODD_COMPONENT = 'podd';
/** Feature strings: exec streaming, the file RPCs, and confinement of file RPCs (beneath). */
export const PODD_FEATURES = ['podd.exec.v1', 'podd.files.v1', 'podd.files.beneath.v1'] as const;

/** Feature of Quiesce / Thaw / GetFreezeStatus: listed only when the host's freeze port exists at start. */
export const QUIESCE_FEATURE = 'podd.quiesce';

/** poddFeatures is the feature list of this podd: PODD_FEATURES plus podd.quiesce when hasFreezePort. */
export function poddFeatures(hasFreezePort: boolean): string[] {
  return hasFreezePort ? [...PODD_FEATURES, QUIESCE_FEATURE] : [...PODD_FEATURES];
}
