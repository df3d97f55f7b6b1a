/**
 * LocalTemplateCatalog: templates in `<stateDir>/templates/<name>/`, built by template-builder
 * from local parts (busybox-static, the Node runtime, the podd bundle). A template in use by a
 * sandbox is never replaced or deleted under it.
 */
import { FailedPreconditionError, NotFoundError } from '@sandnode/shared';
import { buildTemplate, deleteTemplate, listTemplates, readTemplate } from '@sandnode/template-builder';
import type { RecordStore, TemplateCatalog, TemplateInfo } from './types';
import { isPoolMember } from './pool-config';
import { validateTemplateName } from './validate';

export interface LocalTemplateCatalogOptions {
  templatesDir: string;
  poddBundlePath: string;
  poddVersion: string;
  /** Node binary copied into templates (the server's `templateNode`) */
  nodePath?: string;
  store: RecordStore;
}

export class LocalTemplateCatalog implements TemplateCatalog {
  private building: Promise<TemplateInfo> | undefined;
  /** inUse says why a template must not be replaced now (set by the sandbox manager). */
  inUse: (name: string) => string | undefined = () => undefined;
  /**
   * retire runs before a replacing build checks the template's users: the warm pool deletes
   * the template's members (pool.ts) and holds off refills until the returned function is called.
   */
  retire: (name: string) => Promise<() => void> = () => Promise.resolve(() => undefined);

  constructor(private readonly o: LocalTemplateCatalogOptions) {}

  /** Templates being rebuilt or deleted: creates from them are refused until that ends. */
  private readonly replacing = new Set<string>();
  /** The templates of {@link replacing} that are being deleted (the rest are being rebuilt). */
  private readonly deleting = new Set<string>();

  async get(name: string): Promise<TemplateInfo | undefined> {
    if (this.deleting.has(name)) throw new FailedPreconditionError(`template ${name} is being deleted`);
    if (this.replacing.has(name)) throw new FailedPreconditionError(`template ${name} is being rebuilt; try again when the build ends`);
    return readTemplate(this.o.templatesDir, name);
  }

  /**
   * delete removes a template no sandbox uses and returns it as it was. Creates from it are
   * refused from the start (a create already past get() is counted by inUse), its warm-pool
   * members are retired, and a build in progress is waited for. Errors: see
   * TemplateService.DeleteTemplate (nothing is deleted on any of them).
   */
  async delete(name: string): Promise<TemplateInfo> {
    validateTemplateName('name', name);
    if (this.replacing.has(name)) throw new FailedPreconditionError(`template ${name} cannot be deleted now: it is being ${this.deleting.has(name) ? 'deleted' : 'rebuilt'}`);
    this.replacing.add(name);
    this.deleting.add(name);
    let resumePool = () => undefined as void;
    try {
      if (!(await readTemplate(this.o.templatesDir, name))) throw new NotFoundError(`template ${name} not found`);
      // real users first, so that a refused delete leaves the warm pool alone
      this.refuseIfUsed(name);
      resumePool = await this.retire(name);
      this.refuseIfUsed(name);
      while (this.building) await this.building.catch(() => undefined);
      const t = await deleteTemplate(this.o.templatesDir, name);
      if (!t) throw new NotFoundError(`template ${name} not found`);
      return t;
    } finally {
      this.replacing.delete(name);
      this.deleting.delete(name);
      resumePool();
    }
  }

  /** refuseIfUsed throws FailedPreconditionError when a sandbox (not a pool member) or a create in flight uses the template. */
  private refuseIfUsed(name: string): void {
    const users = this.o.store.list().filter((r) => r.template === name && !isPoolMember(r));
    const why = users.length ? `it is used by ${users.length} sandbox(es), e.g. ${users[0]?.sandboxId}; delete them first` : this.inUse(name);
    if (why) throw new FailedPreconditionError(`template ${name} cannot be deleted now: ${why}`);
  }

  async list(): Promise<TemplateInfo[]> {
    return listTemplates(this.o.templatesDir);
  }

  /** build builds one template at a time. Errors: see TemplateService.BuildTemplate. */
  async build(name: string, replace: boolean): Promise<TemplateInfo> {
    validateTemplateName('name', name);
    if (replace) {
      // Refuse creates from it first, then check who uses it (a create already past get() is
      // counted by inUse): no create can slip between the check and the swap.
      if (this.replacing.has(name)) throw new FailedPreconditionError(`template ${name} is already being rebuilt`);
      this.replacing.add(name);
    }
    let resumePool = () => undefined as void;
    try {
      if (replace) {
        resumePool = await this.retire(name);
        const users = this.o.store.list().filter((r) => r.template === name && !isPoolMember(r));
        const why = users.length ? `it is used by ${users.length} sandbox(es), e.g. ${users[0]?.sandboxId}; delete them first` : this.inUse(name);
        if (why) throw new FailedPreconditionError(`template ${name} cannot be replaced now: ${why}`);
      }
      return await this.buildOne(name, replace);
    } finally {
      if (replace) this.replacing.delete(name);
      resumePool();
    }
  }

  private async buildOne(name: string, replace: boolean): Promise<TemplateInfo> {
    while (this.building) await this.building.catch(() => undefined);
    this.building = buildTemplate({
      name,
      templatesDir: this.o.templatesDir,
      poddBundlePath: this.o.poddBundlePath,
      poddVersion: this.o.poddVersion,
      nodePath: this.o.nodePath,
      replace,
    });
    try {
      return await this.building;
    } finally {
      this.building = undefined;
    }
  }
}
