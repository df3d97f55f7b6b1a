/**
 * Template layout: names, the template dir's files, the paths inside a rootfs (the contract
 * between templates, the init, podd and the drivers) and the manifest format.
 */
import { InvalidArgumentError } from '@sandnode/shared';

/** Template names: lower-case letters, digits, `.`, `_`, `-`; 1..63 chars; starts with a letter or digit. */
export const TEMPLATE_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** Version of manifest.json this builder writes and reads. */
export const MANIFEST_FORMAT = 1;
/** Name of the rootfs dir inside a template dir. */
export const ROOTFS_DIR = 'rootfs';
/** Name of the manifest inside a template dir. */
export const MANIFEST_FILE = 'manifest.json';
/** Default busybox binary (Debian: `apt-get install busybox-static`). */
export const DEFAULT_BUSYBOX_PATH = '/bin/busybox';

/** A built template as its manifest describes it. */
export interface TemplateInfo {
  name: string;
  /** version of the podd bundle copied into the template */
  poddVersion: string;
  /** absolute path of the template's read-only rootfs dir */
  rootfsPath: string;
  /** bytes of the rootfs on disk */
  sizeBytes: number;
  /** Unix epoch ms */
  createdAtMs: number;
  /** how long the build took, ms */
  buildMs: number;
}

/** Paths inside the rootfs (the contract between templates, the init, podd and the drivers). */
export const ROOTFS_PATHS = {
  busybox: '/bin/busybox',
  node: '/usr/local/bin/node',
  podd: '/opt/sandnode/podd.js',
  /** what the init runs: turns on podd's compile cache, then loads podd.js (podd-boot.ts) */
  poddBoot: '/opt/sandnode/podd-boot.js',
  /** podd's V8 code cache made at build (podd-boot.ts) */
  poddCompileCache: '/opt/sandnode/compile-cache',
  init: '/sbin/sandnode-init',
  poddSocket: '/run/sandnode/podd.sock',
  poddLog: '/run/sandnode/podd.log',
} as const;

/** Empty dirs every rootfs has, with their modes. */
export const EMPTY_DIRS: Array<[string, number]> = [
  ['/proc', 0o555],
  ['/sys', 0o555],
  ['/dev', 0o755],
  ['/tmp', 0o1777],
  ['/var/tmp', 0o1777],
  ['/workspace', 0o755],
  ['/run/sandnode', 0o755],
  ['/root', 0o700],
  ['/etc', 0o755],
  ['/bin', 0o755],
  ['/sbin', 0o755],
  ['/usr/bin', 0o755],
  ['/usr/local/bin', 0o755],
  ['/opt/sandnode', 0o755],
];

/** Oldest Node major a template may carry (the podd bundle targets node24; engines >=22). */
export const MIN_TEMPLATE_NODE_MAJOR = 22;

/** Leftover temp/old trees older than this are removed by the next build of the name, in ms. */
export const STALE_TEMP_MS = 10 * 60 * 1000;

/** The manifest.json of a template. */
export interface TemplateManifest {
  format: number;
  name: string;
  poddVersion: string;
  /** Sum of the sizes of the rootfs's regular files, bytes. */
  sizeBytes: number;
  /** When the build finished, Unix epoch ms. */
  createdAtMs: number;
  /** How long the build took, ms. */
  buildMs: number;
  /** `node --version` of the copied Node binary. */
  nodeVersion: string;
  /** Host paths the parts came from. */
  sources: { busybox: string; node: string; poddBundle: string };
}

/**
 * validateName throws InvalidArgumentError (gRPC INVALID_ARGUMENT) naming `name` unless
 * name matches TEMPLATE_NAME_RE.
 */
export function validateName(name: string): void {
  if (typeof name !== 'string' || !TEMPLATE_NAME_RE.test(name)) {
    throw new InvalidArgumentError(`name: ${JSON.stringify(name)} is not a template name (${TEMPLATE_NAME_RE.source})`);
  }
}
