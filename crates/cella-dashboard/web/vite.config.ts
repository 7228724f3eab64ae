// The dashboard's build: `npm run build` type-checks (tsc) and writes ../dist, which the Rust crate
// embeds. File names carry content hashes, so the output is the same for the same sources
// (check-dist.sh compares a fresh build with the committed dist/).
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  build: {
    outDir: "../dist",
    emptyOutDir: true,
    assetsDir: "assets",
    sourcemap: false,
    // No inline script anywhere: the page's policy is script-src 'self'.
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    target: "es2022",
    chunkSizeWarningLimit: 1000,
  },
});
