/** podd's identity for GetVersion. Callers check features, never version numbers. */

/** Component name podd reports. */
export const PODD_COMPONENT = 'podd';
/** Feature strings: exec streaming and the file RPCs of sandnode.podd.v1. */
export const PODD_FEATURES = ['podd.exec.v1', 'podd.files.v1'] as const;
