/**
 * LocalTemplateCatalog: templates in `<stateDir>/templates/<name>/`, built by template-builder
 * from local parts (busybox-static, the Node runtime, the podd bundle). A template in use by a
 * sandbox is never replaced under it.
 */
import { FailedPreconditionError } from '@sandnode/shared';
import { buildTemplate, listTemplates, readTemplate } from '@sandnode/template-builder';
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

  /** Templates being rebuilt: creates from them are refused until the rebuild ends. */
  private readonly replacing = new Set<string>();

  async get(name: string): Promise<TemplateInfo | undefined> {
    if (this.replacing.has(name)) throw new FailedPreconditionError(`template ${name} is being rebuilt; try again when the build ends`);
    return readTemplate(this.o.templatesDir, name);
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
