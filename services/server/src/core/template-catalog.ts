/**
 * LocalTemplateCatalog: templates in `<stateDir>/templates/<name>/`, built by template-builder
 * from local parts (busybox-static, the Node runtime, the podd bundle). A template in use by a
 * sandbox is never replaced under it.
 */
import { FailedPreconditionError } from '@sandnode/shared';
import { buildTemplate, listTemplates, readTemplate } from './template-builder';
import type { RecordStore, TemplateCatalog, TemplateInfo } from './types';
import { validateTemplateName } from './validate';

export interface LocalTemplateCatalogOptions {
  templatesDir: string;
  poddBundlePath: string;
  poddVersion: string;
  store: RecordStore;
}

export class LocalTemplateCatalog implements TemplateCatalog {
  private building: Promise<TemplateInfo> | undefined;

  constructor(private readonly o: LocalTemplateCatalogOptions) {}

  async get(name: string): Promise<TemplateInfo | undefined> {
    return readTemplate(this.o.templatesDir, name);
  }

  async list(): Promise<TemplateInfo[]> {
    return listTemplates(this.o.templatesDir);
  }

  /** build builds one template at a time. Errors: see TemplateService.BuildTemplate. */
  async build(name: string, replace: boolean): Promise<TemplateInfo> {
    validateTemplateName('name', name);
    if (replace) {
      const users = this.o.store.list().filter((r) => r.template === name);
      if (users.length) throw new FailedPreconditionError(`template ${name} is used by ${users.length} sandbox(es), e.g. ${users[0]?.sandboxId}; delete them before replacing it`);
    }
    while (this.building) await this.building.catch(() => undefined);
    this.building = buildTemplate({
      name,
      templatesDir: this.o.templatesDir,
      poddBundlePath: this.o.poddBundlePath,
      poddVersion: this.o.poddVersion,
      replace,
    });
    try {
      return await this.building;
    } finally {
      this.building = undefined;
    }
  }
}
