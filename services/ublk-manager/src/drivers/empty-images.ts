/**
 * EmptyExt4Images: one pre-formatted empty ext4 image per size, kept in
 * `<imagesDir>/.templates/ext4-<size>.img` (on the images file system, so a FICLONE can share
 * its extents; a dot dir, so it is never `<imagesDir>/<id>.img` and never a device), from
 * which new empty ext4 devices (sandbox uppers and workspaces) are cloned instead of running
 * mkfs.ext4 each time.
 *
 * A template is made once (sparse temp file, mkfs.ext4, `e2fsck -fn`, fsync, rename), checked
 * with `e2fsck -fn` the first time this process uses it (and again when its inode or mtime
 * changed), and rebuilt when it is missing or not clean. Clones share its ext4 UUID (mkfs
 * gives every template one; nothing in sandnode mounts by UUID).
 */
import { constants as fsc, mkdirSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@sandnode/shared';
import type { CloneResult } from '../core/driver';
import type { RunFn } from './images';

/** Time e2fsck -fn of a template may take, ms. */
const FSCK_TIMEOUT_MS = 60_000;

/** What EmptyExt4Images needs of FileImages. */
export interface TemplateImageOps {
  readonly dir: string;
  createEmpty(file: string, sizeBytes: number): Promise<void>;
  formatExt4(file: string): Promise<void>;
  clone(src: string, dst: string, opts?: { confined?: boolean }): Promise<CloneResult>;
}

/** EmptyExt4Images keeps the templates and clones them. */
export class EmptyExt4Images {
  /** `<imagesDir>/.templates`. */
  readonly dir: string;
  /** Templates checked clean by this process: path -> `<ino>:<mtimeMs>:<size>`. */
  private readonly verified = new Map<string, string>();
  /** One build per size at a time in this process. */
  private readonly building = new Map<number, Promise<string>>();

  constructor(
    private readonly images: TemplateImageOps,
    private readonly run: RunFn,
    private readonly log: Logger,
  ) {
    this.dir = path.join(images.dir, '.templates');
  }

  /** templatePath is `<imagesDir>/.templates/ext4-<sizeBytes>.img`. */
  templatePath(sizeBytes: number): string {
    return path.join(this.dir, `ext4-${sizeBytes}.img`);
  }

  /**
   * cloneInto makes file an empty ext4 of sizeBytes by FICLONE of the template (made or
   * rebuilt first when needed). Resolves with the CloneResult (reflinked false means the
   * template was copied, not shared: the caller should rather run mkfs). Errors: those of
   * mkfs.ext4 / the clone (ResourceExhaustedError when out of space).
   */
  async cloneInto(file: string, sizeBytes: number): Promise<CloneResult> {
    const tpl = await this.ready(sizeBytes);
    return this.images.clone(tpl, file, { confined: true });
  }

  /** ready returns the path of a clean template of sizeBytes, made or rebuilt when missing or not clean. */
  async ready(sizeBytes: number): Promise<string> {
    const tpl = this.templatePath(sizeBytes);
    const key = await stamp(tpl);
    if (key !== undefined && this.verified.get(tpl) === key) return tpl;
    const running = this.building.get(sizeBytes);
    if (running) return running;
    const p = this.verifyOrBuild(tpl, sizeBytes, key).finally(() => this.building.delete(sizeBytes));
    this.building.set(sizeBytes, p);
    return p;
  }

  private async verifyOrBuild(tpl: string, sizeBytes: number, key: string | undefined): Promise<string> {
    if (key !== undefined) {
      if (await this.clean(tpl)) {
        this.verified.set(tpl, key);
        return tpl;
      }
      this.log.warn({ template: tpl }, 'empty ext4 template is not clean (e2fsck -fn); rebuilding it');
      await fs.rm(tpl, { force: true });
    }
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const tmp = path.join(this.dir, `.ext4-${sizeBytes}.${process.pid}.${Date.now()}.tmp`);
    const t0 = performance.now();
    try {
      await this.images.createEmpty(tmp, sizeBytes);
      await this.images.formatExt4(tmp);
      if (!(await this.clean(tmp))) throw new Error(`e2fsck -fn of the new template ${tmp} found problems`);
      const fh = await fs.open(tmp, fsc.O_RDONLY);
      await fh.sync();
      await fh.close();
      await fs.rename(tmp, tpl);
      const dh = await fs.open(this.dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
      await dh.sync();
      await dh.close();
    } catch (err) {
      await fs.rm(tmp, { force: true });
      throw err;
    }
    const k = await stamp(tpl);
    if (k !== undefined) this.verified.set(tpl, k);
    this.log.info({ template: tpl, size_bytes: sizeBytes, build_ms: performance.now() - t0 }, 'empty ext4 template made');
    return tpl;
  }

  /** clean runs `e2fsck -fn` (read-only, forced): true when it exits 0. */
  private async clean(file: string): Promise<boolean> {
    try {
      await this.run('e2fsck', ['-fn', file], { timeoutMs: FSCK_TIMEOUT_MS });
      return true;
    } catch {
      return false;
    }
  }

  /** removeStaleTemps removes the build temps a crashed process left in the templates dir (`.ext4-<size>.<pid>.<ms>.tmp`, pid not alive). */
  async removeStaleTemps(): Promise<void> {
    let names: string[];
    try {
      names = await fs.readdir(this.dir);
    } catch {
      return;
    }
    for (const n of names) {
      const m = /^\.ext4-\d+\.(\d+)\.\d+\.tmp$/.exec(n);
      if (m && !alive(Number(m[1]))) await fs.rm(path.join(this.dir, n), { force: true });
    }
  }
}

/** stamp is `<ino>:<mtimeMs>:<size>` of a regular file (no symlink followed), undefined when missing or not regular. */
async function stamp(file: string): Promise<string | undefined> {
  try {
    const st = await fs.lstat(file);
    return st.isFile() ? `${st.ino}:${st.mtimeMs}:${st.size}` : undefined;
  } catch {
    return undefined;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
