package migrations

// Contracted is the newest contract step applied, for the tests.
var Contracted = contracted
