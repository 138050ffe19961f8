// Builds the page: src/main.tsx and what it imports, React and
// @tasklease/client included, into one file, web/app.js, that the Go
// binary embeds. `node build.mjs OUT` writes OUT instead (the Go test
// TestBundleIsBuiltFromSource does, and compares it with web/app.js).
//
// esbuild, pinned in package.json, gives the same bytes for the same
// sources, so a committed bundle that differs from a fresh build means the
// sources changed without a rebuild.
import * as esbuild from "esbuild";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] ?? path.join(here, "web", "app.js");

// In an app of your own, @tasklease/client comes from npm. The example
// builds the client of this very commit, from its TypeScript sources, so
// the page and the client never drift apart.
const clientSrc = path.join(here, "..", "..", "clients", "typescript", "src");
const client = { "@tasklease/client": "index.ts", "@tasklease/client/react": "react.ts" };

const resolve = {
  name: "resolve",
  setup(build) {
    build.onResolve({ filter: /^@tasklease\/client(\/react)?$/ }, (args) => ({ path: path.join(clientSrc, client[args.path]) }));
    // One React for the page and the client's hook: the example's own,
    // whoever imports it (the client's sources would otherwise find the
    // copy the client's own dev dependencies installed).
    build.onResolve({ filter: /^(react|react-dom|scheduler)(\/.*)?$/ }, async (args) => {
      if (args.pluginData?.fromHere) return undefined;
      const r = await build.resolve(args.path, { kind: args.kind, resolveDir: here, pluginData: { fromHere: true } });
      return r.errors.length > 0 ? { errors: r.errors } : { path: r.path };
    });
  },
};

await esbuild.build({
  absWorkingDir: here,
  entryPoints: ["src/main.tsx"],
  outfile: out,
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  jsx: "automatic",
  minify: true,
  define: { "process.env.NODE_ENV": '"production"' },
  plugins: [resolve],
  logLevel: "warning",
});
