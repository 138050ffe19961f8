// built by `npm run build` from src/ (see package.json)
