/** podd's identity for GetVersion. Callers check features, never version numbers. */

/** Component name podd reports. */
export const PODD_COMPONENT = 'podd';
/** Feature strings: exec streaming, the file RPCs, and confinement of file RPCs (beneath). */
export const PODD_FEATURES = ['podd.exec.v1', 'podd.files.v1', 'podd.files.beneath.v1'] as const;
